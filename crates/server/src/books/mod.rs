//! The trust services' books: what the reputation, canary and fraud services keep in memory
//! between requests. Plain data and their rules of change; none names `AppState`, so the
//! state can hold them and the services (one layer up) can act on them.

pub mod canaries;
pub mod fraud;
pub mod reputation;
