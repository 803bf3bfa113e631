//! The schema a caller's type is extracted under, made strict.
//!
//! Structured output is only as good as the schema the server constrains
//! decoding with. OpenAI's strict mode (and the grammars llama.cpp, vLLM and
//! Ollama build from the same field) want every property listed in `required`
//! — optional fields are expressed as nullable, not as absent — and
//! `additionalProperties: false` on every object, recursively. `schemars`
//! generates neither by default, so [`OutputSchema::for_type`] rewrites its
//! output. The schema also carries a serde check for the caller's type, so a
//! provider can validate an answer locally without knowing the type: a
//! server's promise to honour the schema is never taken on trust.

use std::fmt;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Longest schema name OpenAI accepts.
const MAX_NAME_LEN: usize = 64;

/// A strict JSON schema for one caller type, with that type's serde check.
#[derive(Clone)]
pub struct OutputSchema {
    name: String,
    schema: Value,
    check: fn(&Value) -> Result<(), serde_json::Error>,
}

impl fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputSchema")
            .field("name", &self.name)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

fn check_as<T: DeserializeOwned>(value: &Value) -> Result<(), serde_json::Error> {
    T::deserialize(value).map(drop)
}

impl OutputSchema {
    /// The strict schema for `T`, named after `T` (characters OpenAI does not
    /// allow in a schema name become `_`; at most 64 of them).
    pub fn for_type<T: DeserializeOwned + JsonSchema>() -> Self {
        let generator = schemars::generate::SchemaSettings::draft2020_12()
            .with(|s| {
                s.inline_subschemas = true;
                s.meta_schema = None;
            })
            .into_generator();
        let mut schema = generator.into_root_schema_for::<T>().to_value();
        make_strict(&mut schema);
        OutputSchema {
            name: sanitize_name(&T::schema_name()),
            schema,
            check: check_as::<T>,
        }
    }

    /// The schema's name, as sent in `json_schema.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The strict JSON schema.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Whether `value` deserializes as the caller's type; the serde error when
    /// it does not.
    pub fn check(&self, value: &Value) -> Result<(), serde_json::Error> {
        (self.check)(value)
    }
}

fn sanitize_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME_LEN)
        .collect();
    if cleaned.is_empty() {
        "output".to_owned()
    } else {
        cleaned
    }
}

/// Rewrites a generated schema in place so that every object lists all its
/// properties as required and allows no others, at every depth; drops the
/// `$schema` marker and numeric `format`s (`uint32`, `double`), which strict
/// mode rejects.
pub fn make_strict(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    object.remove("$schema");
    if object.get("type").and_then(Value::as_str) != Some("string") {
        object.remove("format");
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        let names: Vec<Value> = properties.keys().cloned().map(Value::String).collect();
        object.insert("required".to_owned(), Value::Array(names));
        object.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    for keyword in [
        "properties",
        "$defs",
        "definitions",
        "patternProperties",
        "dependentSchemas",
    ] {
        if let Some(map) = object.get_mut(keyword).and_then(Value::as_object_mut) {
            strict_each_value(map);
        }
    }
    for keyword in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(list) = object.get_mut(keyword).and_then(Value::as_array_mut) {
            list.iter_mut().for_each(make_strict);
        }
    }
    for keyword in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
    ] {
        match object.get_mut(keyword) {
            Some(Value::Array(list)) => list.iter_mut().for_each(make_strict),
            Some(sub @ Value::Object(_)) => make_strict(sub),
            _ => {}
        }
    }
}

fn strict_each_value(map: &mut Map<String, Value>) {
    map.values_mut().for_each(make_strict);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        count: u32,
        note: Option<String>,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Inner,
        list: Vec<Inner>,
        properties: Option<f64>,
    }

    fn every_object_is_strict(v: &Value) {
        if let Some(o) = v.as_object() {
            if let Some(props) = o.get("properties").and_then(Value::as_object) {
                let required: Vec<&str> = o["required"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let keys: Vec<&str> = props.keys().map(String::as_str).collect();
                assert_eq!(required, keys);
                assert_eq!(o["additionalProperties"], json!(false));
                props.values().for_each(every_object_is_strict);
            }
            for (k, sub) in o {
                if k != "properties" {
                    every_object_is_strict(sub);
                }
            }
        } else if let Some(a) = v.as_array() {
            a.iter().for_each(every_object_is_strict);
        }
    }

    #[test]
    fn every_object_at_every_depth_is_strict() {
        let s = OutputSchema::for_type::<Outer>();
        assert_eq!(s.name(), "Outer");
        let v = s.schema();
        assert!(v.get("$schema").is_none());
        assert_eq!(v["required"], json!(["name", "inner", "list", "properties"]));
        assert_eq!(v["properties"]["inner"]["required"], json!(["count", "note"]));
        assert_eq!(v["properties"]["list"]["items"]["additionalProperties"], json!(false));
        assert!(v["properties"]["inner"]["properties"]["count"].get("format").is_none());
        every_object_is_strict(v);
    }

    #[test]
    fn the_check_is_the_callers_serde() {
        let s = OutputSchema::for_type::<Inner>();
        assert!(s.check(&json!({"count": 3, "note": null})).is_ok());
        assert!(s.check(&json!({"count": -3, "note": null})).is_err());
        assert!(s.check(&json!("nope")).is_err());
    }

    #[test]
    fn names_are_made_acceptable() {
        assert_eq!(sanitize_name("Wrapper<Foo bar>"), "Wrapper_Foo_bar_");
        assert_eq!(sanitize_name(""), "output");
        assert_eq!(sanitize_name(&"x".repeat(100)).len(), 64);
    }
}
