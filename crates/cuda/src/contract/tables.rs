//! What [`super::CudaOps`] has uploaded: matrices and vectors by handle, and the handles
//! of one model's own weights by their place in that model, so that each of its matrices
//! and vectors is uploaded once and shared by every session and every clone of the ops.
//!
//! A handle indexes a table that only grows, so a handle never dangles; a matrix whose
//! upload failed gets a handle past the table, and reading it reports the cause. This
//! module never launches a kernel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::CudaSlice;
use ferrite_backend::BackendError;

use super::{MatrixId, NAME, VectorId};
use crate::ops::DeviceMatrix;

/// Where a weight of a model lives in it: its address and, for stacked experts, the
/// expert (`usize::MAX` for a plain matrix or vector).
pub(super) type Place = (usize, usize);

#[derive(Debug, Default)]
struct Inner {
    matrices: Vec<Arc<DeviceMatrix>>,
    vectors: Vec<Arc<CudaSlice<f32>>>,
    model_matrices: HashMap<Place, MatrixId>,
    model_vectors: HashMap<Place, VectorId>,
    /// Why the uploads behind handles past the matrix table failed, by handle.
    failed: HashMap<usize, String>,
}

/// The upload tables, shared by the clones of one [`super::CudaOps`].
#[derive(Debug, Default)]
pub(super) struct Tables(Mutex<Inner>);

impl Tables {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the tables half-written: each change is one push
        // or insert.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `m`, returning its handle.
    pub(super) fn push_matrix(&self, m: DeviceMatrix) -> MatrixId {
        let mut t = self.lock();
        t.matrices.push(Arc::new(m));
        MatrixId(t.matrices.len() - 1)
    }

    /// Keeps `v`, returning its handle.
    pub(super) fn push_vector(&self, v: CudaSlice<f32>) -> VectorId {
        let mut t = self.lock();
        t.vectors.push(Arc::new(v));
        VectorId(t.vectors.len() - 1)
    }

    /// The matrix behind `id`.
    pub(super) fn matrix(
        &self,
        op: &'static str,
        id: MatrixId,
    ) -> Result<Arc<DeviceMatrix>, BackendError> {
        let t = self.lock();
        match t.matrices.get(id.0) {
            Some(m) => Ok(m.clone()),
            None => Err(BackendError::Shape {
                op,
                what: match t.failed.get(&id.0) {
                    Some(cause) => format!("a weight whose upload failed: {cause}"),
                    None => format!("weight handle {} of {}", id.0, t.matrices.len()),
                },
            }),
        }
    }

    /// The vector behind `id`.
    pub(super) fn vector(
        &self,
        op: &'static str,
        id: VectorId,
    ) -> Result<Arc<CudaSlice<f32>>, BackendError> {
        let t = self.lock();
        t.vectors
            .get(id.0)
            .cloned()
            .ok_or_else(|| BackendError::Shape {
                op,
                what: format!("vector handle {} of {}", id.0, t.vectors.len()),
            })
    }

    /// The handle of the model matrix at `place`, uploaded by `upload` on first use.
    /// The lock is not held while uploading: two sessions asking at once may both upload,
    /// and the first to finish is kept.
    pub(super) fn model_matrix(
        &self,
        place: Place,
        upload: impl FnOnce() -> Result<DeviceMatrix, BackendError>,
    ) -> MatrixId {
        if let Some(&id) = self.lock().model_matrices.get(&place) {
            return id;
        }
        let uploaded = upload();
        let mut t = self.lock();
        if let Some(&id) = t.model_matrices.get(&place) {
            return id;
        }
        match uploaded {
            Ok(m) => {
                t.matrices.push(Arc::new(m));
                let id = MatrixId(t.matrices.len() - 1);
                t.model_matrices.insert(place, id);
                id
            }
            Err(e) => {
                // A handle no matrix will ever have, counted down from the top of the
                // index range.
                let id = usize::MAX - t.failed.len();
                t.failed.insert(id, format!("{NAME} upload: {e}"));
                MatrixId(id)
            }
        }
    }

    /// The handle of the model vector at `place`, uploaded by `upload` on first use.
    pub(super) fn model_vector(
        &self,
        place: Place,
        upload: impl FnOnce() -> Result<CudaSlice<f32>, BackendError>,
    ) -> Result<VectorId, BackendError> {
        if let Some(&id) = self.lock().model_vectors.get(&place) {
            return Ok(id);
        }
        let v = upload()?;
        let mut t = self.lock();
        if let Some(&id) = t.model_vectors.get(&place) {
            return Ok(id);
        }
        t.vectors.push(Arc::new(v));
        let id = VectorId(t.vectors.len() - 1);
        t.model_vectors.insert(place, id);
        Ok(id)
    }
}
