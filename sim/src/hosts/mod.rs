//! The hosts: one module per kind of machine in the modelled deployment.
//!
//! Each host is what turmoil runs — a model server, the shared cache host, or
//! a worker — plus the two seams they share: the HTTP transport workers reach
//! servers through, and the per-host clock that gives every machine its own
//! skew. Only these modules know turmoil's sockets; everything above them
//! (the world, the evidence, the judgement) sees hosts through their handles
//! and the trace.

pub mod cache_host;
pub mod clock;
pub mod server;
pub mod transport;
pub mod worker;
