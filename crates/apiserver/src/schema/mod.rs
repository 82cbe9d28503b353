//! What the served kinds look like, above the store: structural schemas of custom resources
//! (`structural`), the built-in kinds' schemas (`builtin_schemas`), CustomResourceDefinitions
//! (`crd`), the fields each kind can be selected by (`field_labels`), discovery and OpenAPI
//! documents (`openapi`; v2 also in gnostic's protobuf, `gnostic`), and server-side printing (`printers`' table of
//! columns, `table`'s Tables). It imports the store, never `patch/` or `http/`.

pub mod builtin_schemas;
pub mod crd;
pub mod discovery;
pub mod field_labels;
pub mod gnostic;
pub mod openapi;
pub mod printers;
pub mod structural;
pub mod table;
