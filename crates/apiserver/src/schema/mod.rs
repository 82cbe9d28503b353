//! What the served kinds look like, above the store: structural schemas of custom resources
//! (`structural`), the built-in kinds' schemas (`builtin_schemas`), CustomResourceDefinitions
//! (`crd`), discovery and OpenAPI documents, and server-side printing (`printers`' table of
//! columns, `table`'s Tables). It imports the store, never `patch/` or `http/`.

pub mod builtin_schemas;
pub mod crd;
pub mod discovery;
pub mod openapi;
pub mod printers;
pub mod structural;
pub mod table;
