//! Layouts: how tile elements map to registers, lanes and warps. (Placeholder.)
