//! The store, the bottom layer: objects in SQLite with their resource versions and change
//! stream (`storage`), the registry of served kinds (`registry`), the stored form of Events
//! (`events`) and files only the server's user may read (`private_files`). It imports no other
//! layer.

pub mod events;
pub mod private_files;
pub mod registry;
pub mod storage;
