//! The protocol between the daemon and the agent inside a sandbox.
//!
//! One byte stream per sandbox (a unix socket today, vsock later) carries many logical
//! streams through [`mux`]. Each stream starts with a [`Request`], after which both sides
//! exchange [`Event`]s (JSON) and raw data chunks on numbered channels.

pub mod messages;
pub mod mux;
pub mod pipe;

pub use messages::*;
pub use mux::{Incoming, Message, Mux, MuxError, Role, Stream, StreamReceiver, StreamSender};
