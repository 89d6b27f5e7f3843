//! The #[kernel] macro.
