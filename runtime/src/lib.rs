//! Tessera runtime.
