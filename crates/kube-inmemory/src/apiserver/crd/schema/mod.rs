//! The structural schema of a custom resource version: the `openAPIV3Schema` of a
//! CustomResourceDefinition parsed into nodes, checked for what the real API server
//! requires of a structural schema (a type on every specified field, no `uniqueItems`,
//! `additionalProperties` and `properties` exclusive, list and map types consistent,
//! metadata limited to name and generateName, ...), and answering the questions pruning,
//! validation, CEL and server-side apply ask of it.
//!
//! This module holds the parsed schema and its queries; `parser` builds it from the
//! definition, `structural` and `extensions` hold the checks the parser applies to each node.

mod extensions;
mod parser;
mod structural;

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Number, Value, json};

use super::rules::Rule;
use crate::apiserver::resources::ListType;

pub(crate) use self::parser::parse;

/// A value type of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SchemaType {
    /// `object`.
    Object,
    /// `array`.
    Array,
    /// `string`.
    String,
    /// `integer`.
    Integer,
    /// `number`.
    Number,
    /// `boolean`.
    Boolean,
}

impl SchemaType {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "object" => Self::Object,
            "array" => Self::Array,
            "string" => Self::String,
            "integer" => Self::Integer,
            "number" => Self::Number,
            "boolean" => Self::Boolean,
            _ => return None,
        })
    }

    /// The name the schema uses.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Object => "object",
            Self::Array => "array",
            Self::String => "string",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::Boolean => "boolean",
        }
    }
}

/// One node of a structural schema (or of the value validations nested in `allOf`,
/// `anyOf`, `oneOf` and `not`, which use the same keywords minus the structural ones).
#[derive(Debug, Default)]
#[allow(clippy::struct_excessive_bools, reason = "one field per boolean schema keyword")]
pub(crate) struct Node {
    /// `type`.
    pub(crate) ty: Option<SchemaType>,
    /// `nullable`.
    pub(crate) nullable: bool,
    /// `format`.
    pub(crate) format: Option<String>,
    /// `properties`.
    pub(crate) properties: BTreeMap<String, Node>,
    /// `additionalProperties` (a schema; `true` is an empty schema).
    pub(crate) additional: Option<Box<Node>>,
    /// `items`.
    pub(crate) items: Option<Box<Node>>,
    /// `required`.
    pub(crate) required: Vec<String>,
    /// `enum`.
    pub(crate) enumeration: Option<Vec<Value>>,
    /// `pattern` (source, compiled).
    pub(crate) pattern: Option<(String, Regex)>,
    /// `maximum`.
    pub(crate) maximum: Option<Number>,
    /// `exclusiveMaximum`.
    pub(crate) exclusive_maximum: bool,
    /// `minimum`.
    pub(crate) minimum: Option<Number>,
    /// `exclusiveMinimum`.
    pub(crate) exclusive_minimum: bool,
    /// `multipleOf`.
    pub(crate) multiple_of: Option<Number>,
    /// `maxLength`.
    pub(crate) max_length: Option<u64>,
    /// `minLength`.
    pub(crate) min_length: Option<u64>,
    /// `maxItems`.
    pub(crate) max_items: Option<u64>,
    /// `minItems`.
    pub(crate) min_items: Option<u64>,
    /// `maxProperties`.
    pub(crate) max_properties: Option<u64>,
    /// `minProperties`.
    pub(crate) min_properties: Option<u64>,
    /// `default`.
    pub(crate) default: Option<Value>,
    /// `x-kubernetes-preserve-unknown-fields`.
    pub(crate) preserve_unknown: bool,
    /// `x-kubernetes-int-or-string`.
    pub(crate) int_or_string: bool,
    /// `x-kubernetes-embedded-resource`.
    pub(crate) embedded: bool,
    /// `x-kubernetes-list-type`.
    pub(crate) list_type: Option<String>,
    /// `x-kubernetes-list-map-keys`.
    pub(crate) list_map_keys: Vec<String>,
    /// `x-kubernetes-map-type`.
    pub(crate) map_type: Option<String>,
    /// `allOf`.
    pub(crate) all_of: Vec<Node>,
    /// `anyOf`.
    pub(crate) any_of: Vec<Node>,
    /// `oneOf`.
    pub(crate) one_of: Vec<Node>,
    /// `not`.
    pub(crate) not: Option<Box<Node>>,
    /// `x-kubernetes-validations`, compiled once the schema is known to be structural.
    pub(crate) rules: Vec<Rule>,
    /// `x-kubernetes-validations` as written.
    pub(crate) raw_rules: Vec<Value>,
}

impl Node {
    /// The schema of field `name` of an object node: a property, else
    /// `additionalProperties`.
    pub(crate) fn field(&self, name: &str) -> Option<&Node> {
        self.properties.get(name).or(self.additional.as_deref())
    }

    /// Whether a list of this schema is a `map` list, and its keys.
    pub(crate) fn map_keys(&self) -> Option<&[String]> {
        (self.list_type.as_deref() == Some("map")).then_some(self.list_map_keys.as_slice())
    }

    /// Whether any node at or below this one carries CEL rules.
    pub(crate) fn has_rules(&self) -> bool {
        !self.rules.is_empty()
            || self.properties.values().any(Node::has_rules)
            || self.additional.as_deref().is_some_and(Node::has_rules)
            || self.items.as_deref().is_some_and(Node::has_rules)
            || self.all_of.iter().any(Node::has_rules)
    }
}

/// The schema of one version of a custom resource.
#[derive(Debug)]
pub(crate) struct Schema {
    /// The root node (`openAPIV3Schema`).
    pub(crate) root: Node,
    /// The schema as written, for the `OpenAPI` documents.
    pub(crate) source: Value,
}

impl Schema {
    /// The node at a dotted path from the object root (`spec.ipam.subnets`,
    /// `spec.routes[].gateway`: `[]` steps into list items).
    pub(crate) fn node_at(&self, path: &str) -> Option<&Node> {
        let mut node = &self.root;
        if path.is_empty() {
            return Some(node);
        }
        for segment in path.split('.') {
            let name = segment.trim_end_matches("[]");
            let items = (segment.len() - name.len()) / 2;
            node = node.field(name)?;
            for _ in 0..items {
                node = node.items.as_deref()?;
            }
        }
        Some(node)
    }

    /// Server-side apply's view of the list at `path`.
    pub(crate) fn list_type(&self, path: &str) -> ListType {
        match self.node_at(path) {
            Some(n) if n.list_type.as_deref() == Some("set") => ListType::Set,
            Some(n) if n.list_type.as_deref() == Some("map") => {
                ListType::Map(n.list_map_keys.clone())
            }
            _ => ListType::Atomic,
        }
    }

    /// Whether the object at `path` is `x-kubernetes-map-type: atomic`.
    pub(crate) fn is_atomic_object(&self, path: &str) -> bool {
        self.node_at(path).is_some_and(|n| n.map_type.as_deref() == Some("atomic"))
    }

    /// The schema for the `OpenAPI` v3 document (what `kubectl explain` reads).
    pub(crate) fn openapi(&self) -> Value {
        let mut doc = self.source.clone();
        if let Some(props) = doc.get_mut("properties").and_then(Value::as_object_mut) {
            for (name, fallback) in [
                ("apiVersion", json!({"type": "string"})),
                ("kind", json!({"type": "string"})),
                ("metadata", json!({"type": "object"})),
            ] {
                props.entry(name).or_insert(fallback);
            }
        }
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(schema: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        parse(schema, "s", &mut errs);
        errs.iter().map(|e| format!("{}: {}", e.field, e.message)).collect()
    }

    #[test]
    fn structural_rules() {
        assert!(
            errors(&json!({"type": "object", "properties": {"spec": {"type": "object"}}}))
                .is_empty()
        );
        let e = errors(&json!({"type": "object", "properties": {"spec": {"properties": {}}}}));
        assert_eq!(
            e,
            [
                "s.properties[spec].type: Required value: must not be empty for specified object fields"
            ]
        );
        let e = errors(
            &json!({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true, "items": {"type": "string"}}}}),
        );
        assert_eq!(
            e,
            [
                "s.properties[a].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"
            ]
        );
        let e = errors(
            &json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": {"type": "string"}}}}),
        );
        assert_eq!(
            e,
            [
                "s.properties[a].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive"
            ]
        );
        let e = errors(
            &json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}),
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("s.properties[metadata]: Forbidden"), "{e:?}");
        let e = errors(
            &json!({"type": "object", "properties": {"a": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"], "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}}),
        );
        assert_eq!(
            e,
            [
                "s.properties[a].items.properties[k].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"
            ]
        );
        let e = errors(
            &json!({"type": "object", "properties": {"a": {"type": "string", "allOf": [{"properties": {"b": {"type": "string"}}}]}}}),
        );
        assert!(
            e.iter().any(|m| m.contains(
                "allOf[0].properties[b].type: Forbidden: must be empty to be structural"
            )),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.contains(
                "s.properties[a].properties[b]: Required value: because it is defined in"
            )),
            "{e:?}"
        );
    }

    #[test]
    fn paths_find_nodes_and_list_types() {
        let mut errs = Vec::new();
        let s = parse(
            &json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
                "routes": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["dst"],
                           "items": {"type": "object", "required": ["dst"], "properties": {"dst": {"type": "string"}, "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}},
                "sel": {"type": "object", "x-kubernetes-map-type": "atomic"}}}}}),
            "",
            &mut errs,
        );
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(s.list_type("spec.routes"), ListType::Map(vec!["dst".into()]));
        assert_eq!(s.list_type("spec.routes[].tags"), ListType::Set);
        assert_eq!(s.list_type("spec.other"), ListType::Atomic);
        assert!(s.is_atomic_object("spec.sel"));
        assert!(!s.is_atomic_object("spec"));
    }
}
