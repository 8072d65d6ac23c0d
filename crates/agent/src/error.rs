//! The one error type request handlers return.

use corral_proto::{ErrorKind, MuxError};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Something the client should hear about, as an `Error` event.
    #[error("{message}")]
    Request { kind: ErrorKind, message: String },
    /// The stream or connection broke; there is nobody left to tell.
    #[error("stream closed: {0}")]
    Stream(#[from] MuxError),
}

impl AgentError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        AgentError::Request { kind, message: message.into() }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// An OS error about `subject` (usually a path), phrased for a client to show a user.
    pub fn io(subject: impl std::fmt::Display, err: &std::io::Error) -> Self {
        let kind = ErrorKind::from_io(err);
        let message = match kind {
            ErrorKind::NotFound => format!("no such file or directory: {subject}"),
            ErrorKind::PermissionDenied => format!("permission denied: {subject}"),
            ErrorKind::AlreadyExists => format!("already exists: {subject}"),
            ErrorKind::NotADirectory => format!("not a directory: {subject}"),
            ErrorKind::IsADirectory => format!("is a directory: {subject}"),
            ErrorKind::NoSpace => format!("no space left on device: {subject}"),
            _ => format!("{subject}: {err}"),
        };
        Self::new(kind, message)
    }
}

/// Shorthand for `map_err(|e| AgentError::io(subject, &e))`.
pub trait IoContext<T> {
    fn context(self, subject: impl std::fmt::Display) -> Result<T, AgentError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn context(self, subject: impl std::fmt::Display) -> Result<T, AgentError> {
        self.map_err(|err| AgentError::io(subject, &err))
    }
}
