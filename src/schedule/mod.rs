//! A pool's schedule, pure: the grammar of a window ([`grammar`]), when a window is open
//! ([`window`]) and whether two windows can be open at once ([`overlap`]). The schedule
//! controller (`crate::controller::schedule`) and the Group admission rules read it; it performs
//! no I/O.

pub mod grammar;
pub mod overlap;
pub mod window;

pub use grammar::{Days, GrammarError, Window};
pub use overlap::first_shared_instant;
pub use window::{Opening, State};
