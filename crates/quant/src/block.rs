//! Viewing raw GGUF bytes as typed GGML blocks.
//!
//! Every block struct in this crate is `#[repr(C)]`, built only from byte arrays (so its
//! alignment is 1 and it has no padding), and every bit pattern is a valid value. That lets
//! a byte slice be reinterpreted as a block slice without copying, which is what the
//! [`Block`] trait and [`cast_blocks`] provide.

/// A GGML block: `#[repr(C)]`, alignment 1, no padding, every byte pattern valid.
///
/// # Safety
/// Implement only for structs made exclusively of `u8` arrays with `#[repr(C)]`; the
/// [`impl_block!`] macro asserts size and alignment at compile time.
pub(crate) unsafe trait Block: Sized {}

/// Implements [`Block`] and asserts the size and alignment at compile time.
macro_rules! impl_block {
    ($ty:ty, $bytes:expr) => {
        const _: () = assert!(std::mem::size_of::<$ty>() == $bytes);
        const _: () = assert!(std::mem::align_of::<$ty>() == 1);
        // SAFETY: the struct is #[repr(C)] and made only of u8 arrays (checked by review of
        // each use site); the asserts above prove the size and alignment 1.
        unsafe impl $crate::block::Block for $ty {}
    };
}
pub(crate) use impl_block;

/// The whole blocks at the start of `bytes` (a trailing partial block is ignored).
pub(crate) fn cast_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    let n = bytes.len() / std::mem::size_of::<B>();
    // SAFETY: `B: Block` guarantees alignment 1, no padding and that every byte pattern is a
    // valid `B`; `n * size_of::<B>() <= bytes.len()`, so the view stays inside `bytes` and
    // inherits its lifetime and immutability.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), n) }
}

/// Mutable counterpart of [`cast_blocks`].
pub(crate) fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    let n = bytes.len() / std::mem::size_of::<B>();
    // SAFETY: as in `cast_blocks`; the exclusive borrow of `bytes` moves to the result, so
    // no aliasing view exists while it lives.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) }
}

/// An IEEE half stored little-endian, as f32.
#[inline]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// `x` rounded to IEEE half, little-endian bytes.
#[inline]
pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Round half away from zero, like C's `roundf` (ggml's `nearest_int` differs only on ties,
/// which do not matter for reference quality).
#[inline]
pub(crate) fn round_i32(x: f32) -> i32 {
    x.round() as i32
}
