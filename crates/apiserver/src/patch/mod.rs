//! Changing objects by patch, above the schemas: PATCH bodies (`bodies`: JSON patch, merge
//! patch, dispatch), strategic merge patch (`strategic_merge`, with the built-in kinds' patch
//! metadata in `patch_meta`) and server-side apply with field ownership (`apply`). It imports
//! the layers below, never `http/`.

pub mod apply;
pub mod bodies;
pub mod patch_meta;
pub mod strategic_merge;
