//! PyO3 bindings (module `aphro`).
