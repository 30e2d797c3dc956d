//! Runnable examples live in examples/examples/.
