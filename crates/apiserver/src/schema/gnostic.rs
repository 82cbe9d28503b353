//! OpenAPI v2 in protobuf: the messages of gnostic's `openapi_v2` (`OpenAPIv2.proto`, field
//! numbers as there) that a Swagger 2.0 document of this server uses, and the document's JSON
//! form turned into them. kubectl reads `/openapi/v2` only in this form (`kubectl explain
//! --output=plaintext-openapiv2`, and the check whether a kind's PATCH takes
//! `fieldValidation` when its OpenAPI v3 cache lacks the kind). A message left out here is one
//! no document of this server has; a JSON key without a field here is one gnostic has not
//! either (OpenAPI v3's `nullable`, `anyOf`, `oneOf`).

use prost::Message;
use serde_json::{Map, Value};

#[derive(Clone, PartialEq, Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PathItem {
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Operation {
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `oneof { Parameter parameter = 1; … }`: a oneof of one set member is that field on the wire.
#[derive(Clone, PartialEq, Message)]
pub struct ParametersItem {
    #[prost(message, optional, tag = "1")]
    pub parameter: Option<Parameter>,
}

/// `oneof { …; NonBodyParameter non_body_parameter = 2 }`.
#[derive(Clone, PartialEq, Message)]
pub struct Parameter {
    #[prost(message, optional, tag = "2")]
    pub non_body_parameter: Option<NonBodyParameter>,
}

/// `oneof { …; QueryParameterSubSchema query_parameter_sub_schema = 3; … }`.
#[derive(Clone, PartialEq, Message)]
pub struct NonBodyParameter {
    #[prost(message, optional, tag = "3")]
    pub query_parameter_sub_schema: Option<QueryParameterSubSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct QueryParameterSubSchema {
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    /// `ResponseValue { oneof { Response response = 1; … } }`.
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResponseValue {
    #[prost(message, optional, tag = "1")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    /// `SchemaItem { oneof { Schema schema = 1; … } }`.
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SchemaItem {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "6")]
    pub multiple_of: f64,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(bool, tag = "8")]
    pub exclusive_maximum: bool,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(bool, tag = "10")]
    pub exclusive_minimum: bool,
    #[prost(int64, tag = "11")]
    pub max_length: i64,
    #[prost(int64, tag = "12")]
    pub min_length: i64,
    #[prost(string, tag = "13")]
    pub pattern: String,
    #[prost(int64, tag = "14")]
    pub max_items: i64,
    #[prost(int64, tag = "15")]
    pub min_items: i64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(int64, tag = "17")]
    pub max_properties: i64,
    #[prost(int64, tag = "18")]
    pub min_properties: i64,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, boxed, tag = "21")]
    pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `oneof { Schema schema = 1; bool boolean = 2; }`: one of the two is set.
#[derive(Clone, PartialEq, Message)]
pub struct AdditionalPropertiesItem {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<Schema>,
    #[prost(bool, optional, tag = "2")]
    pub boolean: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

/// A value as YAML text (`Any.yaml`, field 2), which is how gnostic carries `default`, `enum`
/// and vendor extensions; JSON is YAML.
#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

fn any(value: &Value) -> Any {
    Any {
        yaml: value.to_string(),
    }
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_string()
}

fn extensions(object: &Map<String, Value>) -> Vec<NamedAny> {
    object
        .iter()
        .filter(|(name, _)| name.starts_with("x-"))
        .map(|(name, value)| NamedAny {
            name: name.clone(),
            value: Some(any(value)),
        })
        .collect()
}

fn named_schemas(object: Option<&Value>) -> Vec<NamedSchema> {
    object
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, value)| NamedSchema {
            name: name.clone(),
            value: Some(schema(value)),
        })
        .collect()
}

/// A Swagger 2.0 schema object as gnostic's `Schema`.
pub fn schema(value: &Value) -> Schema {
    let Some(object) = value.as_object() else {
        return Schema::default();
    };
    let number = |key: &str| value[key].as_f64().unwrap_or_default();
    let integer = |key: &str| value[key].as_i64().unwrap_or_default();
    let flag = |key: &str| value[key].as_bool().unwrap_or_default();
    let strings = |key: &str| -> Vec<String> {
        value[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    };
    Schema {
        r#ref: text(value, "$ref"),
        format: text(value, "format"),
        title: text(value, "title"),
        description: text(value, "description"),
        default: object.get("default").map(any),
        multiple_of: number("multipleOf"),
        maximum: number("maximum"),
        exclusive_maximum: flag("exclusiveMaximum"),
        minimum: number("minimum"),
        exclusive_minimum: flag("exclusiveMinimum"),
        max_length: integer("maxLength"),
        min_length: integer("minLength"),
        pattern: text(value, "pattern"),
        max_items: integer("maxItems"),
        min_items: integer("minItems"),
        unique_items: flag("uniqueItems"),
        max_properties: integer("maxProperties"),
        min_properties: integer("minProperties"),
        required: strings("required"),
        r#enum: value["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .map(any)
            .collect(),
        additional_properties: object.get("additionalProperties").map(|a| {
            Box::new(match a {
                Value::Bool(allowed) => AdditionalPropertiesItem {
                    schema: None,
                    boolean: Some(*allowed),
                },
                schema_value => AdditionalPropertiesItem {
                    schema: Some(schema(schema_value)),
                    boolean: None,
                },
            })
        }),
        r#type: match &value["type"] {
            Value::String(one) => Some(TypeItem {
                value: vec![one.clone()],
            }),
            _ => None,
        },
        items: object.get("items").map(|items| ItemsItem {
            schema: vec![schema(items)],
        }),
        all_of: value["allOf"]
            .as_array()
            .into_iter()
            .flatten()
            .map(schema)
            .collect(),
        properties: object.get("properties").map(|p| Properties {
            additional_properties: named_schemas(Some(p)),
        }),
        vendor_extension: extensions(object),
    }
}

fn operation(value: &Value) -> Option<Operation> {
    let object = value.as_object()?;
    let parameters = value["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| ParametersItem {
            parameter: Some(Parameter {
                non_body_parameter: Some(NonBodyParameter {
                    query_parameter_sub_schema: Some(QueryParameterSubSchema {
                        r#in: text(p, "in"),
                        name: text(p, "name"),
                        r#type: text(p, "type"),
                        unique_items: p["uniqueItems"].as_bool().unwrap_or_default(),
                    }),
                }),
            }),
        })
        .collect();
    let responses = value["responses"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(code, response)| NamedResponseValue {
            name: code.clone(),
            value: Some(ResponseValue {
                response: Some(Response {
                    description: text(response, "description"),
                    schema: response.get("schema").map(|s| SchemaItem {
                        schema: Some(schema(s)),
                    }),
                }),
            }),
        })
        .collect();
    Some(Operation {
        operation_id: text(value, "operationId"),
        parameters,
        responses: Some(Responses {
            response_code: responses,
        }),
        vendor_extension: extensions(object),
    })
}

/// A Swagger 2.0 document of this server (its query parameters only, as it has no others) in
/// gnostic's protobuf encoding.
pub fn encode(document: &Value) -> Vec<u8> {
    let paths = document["paths"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(path, item)| NamedPathItem {
            name: path.clone(),
            value: Some(PathItem {
                get: operation(&item["get"]),
                put: operation(&item["put"]),
                post: operation(&item["post"]),
                delete: operation(&item["delete"]),
                patch: operation(&item["patch"]),
            }),
        })
        .collect();
    Document {
        swagger: text(document, "swagger"),
        info: Some(Info {
            title: text(&document["info"], "title"),
            version: text(&document["info"], "version"),
        }),
        paths: Some(Paths { path: paths }),
        definitions: Some(Definitions {
            additional_properties: named_schemas(document.get("definitions")),
        }),
    }
    .encode_to_vec()
}
