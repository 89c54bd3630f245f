//! [`ferrite_model::Weights`] for [`CudaOps`]: the one forward pass reads a model's
//! matrices and vectors through handles uploaded at their first use and kept in the ops'
//! shared tables, keyed by where each lives in the model. One `CudaOps` (and its clones)
//! must serve one model, which outlives it: a key is an address in that model.
//!
//! The rows go up as the file stores them (or as the f32 copy of `--precision f32`), the
//! same bytes the CUDA model uploads; nothing here converts a value.

use ferrite_model::{Experts, Model, ModelError, Weight, Weights};

use super::tables::Place;
use super::{CudaOps, MatrixId, VectorId};

/// The place of a plain matrix (not one expert of a stack).
fn plain<T>(at: &T) -> Place {
    (std::ptr::from_ref(at) as usize, usize::MAX)
}

impl Weights for CudaOps {
    fn matrix<'a>(&'a self, m: &'a Model, w: &'a Weight) -> MatrixId {
        self.tables
            .model_matrix(plain(w), || self.upload_matrix(m.host_matrix(w)))
    }

    fn expert<'a>(&'a self, m: &'a Model, x: &'a Experts, e: usize) -> MatrixId {
        let place = (plain(x).0, e);
        self.tables
            .model_matrix(place, || self.upload_matrix(x.host_matrix(m.gguf(), e)))
    }

    fn table<'a>(&'a self, m: &'a Model, w: &'a Weight) -> MatrixId {
        // The embedding kernel reads the rows the products read: one upload serves both.
        Weights::matrix(self, m, w)
    }

    fn param<'a>(&'a self, v: &'a [f32]) -> Result<VectorId, ModelError> {
        // Keyed by the slice's start and length: a part of a model vector (one expert's
        // bias) is a vector of its own.
        let place = (v.as_ptr() as usize, v.len());
        let id = self.tables.model_vector(place, || self.upload_vector(v))?;
        Ok(id)
    }
}
