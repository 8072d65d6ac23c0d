//! Safe wrappers for setting up child processes inside a sandbox (used by the agent).
