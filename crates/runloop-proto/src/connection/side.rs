//! Sides: the party a [`Table`](super::Table) is kept for, and what that
//! party holds besides the numbers.
//!
//! The rules of a connection are one set, but each party meets them from
//! its own end. The server receives the client's frames and answers them; the
//! client chooses its numbers and receives the server's frames; an observer
//! of a capture receives both and answers nothing. A table's methods for one
//! side exist only on a table of that side, so a server cannot pick a scope
//! number and a client cannot answer a request.

use std::fmt;

/// The party a table is kept for. Sealed: the three below are all there are.
pub trait Side: fmt::Debug + private::Sealed {}

/// The provider's server: receives the client's frames, answers them, and
/// sends finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    /// Scopes open at once; a request past it gets a bare finish.
    pub(super) max_scopes: usize,
    /// Channels open at once in one scope; a run-loop request past it gets
    /// a bare channel finish.
    pub(super) max_channels: usize,
}

/// The caller's client: chooses scope and channel numbers, sends requests,
/// and receives the server's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Client {
    /// Where the client looks for its next free scope number.
    pub(super) next_scope: u32,
}

/// An observer of both directions, which answers nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observer;

impl Side for Server {}
impl Side for Client {}
impl Side for Observer {}

mod private {
    pub trait Sealed {}
    impl Sealed for super::Server {}
    impl Sealed for super::Client {}
    impl Sealed for super::Observer {}
}
