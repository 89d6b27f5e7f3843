//! Axis information: contiguity, divisibility and constancy of integer tiles. (Placeholder.)
