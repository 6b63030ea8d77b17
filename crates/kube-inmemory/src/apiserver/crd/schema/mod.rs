//! The structural schema of a custom resource version: the `openAPIV3Schema` of a
//! CustomResourceDefinition parsed into nodes, checked for what the real API server
//! requires of a structural schema (a type on every specified field, no `uniqueItems`,
//! `additionalProperties` and `properties` exclusive, list and map types consistent,
//! metadata limited to name and generateName, ...), and answering the questions pruning,
//! validation, CEL and server-side apply ask of it.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Number, Value, json};

use super::field::{child, forbidden, index, invalid, key, not_supported, required};
use super::rules::Rule;
use crate::apiserver::error::FieldError;
use crate::apiserver::resources::ListType;

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

/// Where in a schema a node sits, as far as the structural rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Item,
    Field,
}

/// What the parser knows about a node's surroundings.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools, reason = "independent facts about a node's place")]
struct Ctx {
    level: Level,
    /// Inside `allOf`/`anyOf`/`oneOf`/`not`: value validations only.
    nested: bool,
    /// CEL rules allowed in a nested node (`allOf` only).
    nested_rules: bool,
    /// Why defaults are not allowed here, if they are not.
    no_defaults: Option<String>,
    /// Inside the apiVersion/kind/metadata of a resource.
    inside_meta: bool,
    /// The node is the root of a resource (the schema root or an embedded resource).
    resource_root: bool,
}

const SUPPORTED_TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];

fn string_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn count(v: &Value, name: &str) -> Option<u64> {
    v.get(name).and_then(Value::as_u64)
}

fn number(v: &Value, name: &str) -> Option<Number> {
    match v.get(name) {
        Some(Value::Number(n)) => Some(n.clone()),
        _ => None,
    }
}

fn flag(v: &Value, name: &str) -> bool {
    v.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// Parses and checks `openAPIV3Schema` (at `path` in the definition). CEL rules are
/// not compiled here.
pub(crate) fn parse(source: &Value, path: &str, errs: &mut Vec<FieldError>) -> Schema {
    let ctx = Ctx {
        level: Level::Root,
        nested: false,
        nested_rules: false,
        no_defaults: None,
        inside_meta: false,
        resource_root: true,
    };
    if flag(source, "nullable") {
        errs.push(forbidden(child(path, "nullable"), "nullable cannot be true at the root"));
    }
    let root = parse_node(source, path, &ctx, errs);
    Schema { root, source: source.clone() }
}

#[allow(
    clippy::too_many_lines,
    reason = "one check per keyword, in the order upstream checks them"
)]
fn parse_node(v: &Value, path: &str, ctx: &Ctx, errs: &mut Vec<FieldError>) -> Node {
    let Some(obj) = v.as_object() else {
        errs.push(invalid(path, v, "must be a schema object"));
        return Node::default();
    };
    let mut node = Node::default();
    // type
    match obj.get("type").and_then(Value::as_str) {
        Some("null") => errs.push(forbidden(
            child(path, "type"),
            "type cannot be set to null, use nullable as an alternative",
        )),
        Some(t) if !t.is_empty() => match SchemaType::parse(t) {
            Some(ty) => node.ty = Some(ty),
            None => errs.push(not_supported(
                child(path, "type"),
                &json!(t),
                &SUPPORTED_TYPES.map(str::to_owned),
            )),
        },
        _ => {}
    }
    node.nullable = flag(v, "nullable");
    node.format =
        obj.get("format").and_then(Value::as_str).filter(|f| !f.is_empty()).map(str::to_owned);
    node.required = string_list(obj.get("required"));
    node.enumeration = obj.get("enum").and_then(Value::as_array).cloned();
    node.maximum = number(v, "maximum");
    node.minimum = number(v, "minimum");
    node.exclusive_maximum = flag(v, "exclusiveMaximum");
    node.exclusive_minimum = flag(v, "exclusiveMinimum");
    node.multiple_of = number(v, "multipleOf");
    node.max_length = count(v, "maxLength");
    node.min_length = count(v, "minLength");
    node.max_items = count(v, "maxItems");
    node.min_items = count(v, "minItems");
    node.max_properties = count(v, "maxProperties");
    node.min_properties = count(v, "minProperties");
    node.default = obj.get("default").cloned();
    node.int_or_string = flag(v, "x-kubernetes-int-or-string");
    node.embedded = flag(v, "x-kubernetes-embedded-resource");
    node.list_type = obj.get("x-kubernetes-list-type").and_then(Value::as_str).map(str::to_owned);
    node.list_map_keys = string_list(obj.get("x-kubernetes-list-map-keys"));
    node.map_type = obj.get("x-kubernetes-map-type").and_then(Value::as_str).map(str::to_owned);
    node.raw_rules =
        obj.get("x-kubernetes-validations").and_then(Value::as_array).cloned().unwrap_or_default();
    match obj.get("x-kubernetes-preserve-unknown-fields") {
        Some(Value::Bool(true)) => node.preserve_unknown = true,
        Some(other @ Value::Bool(false)) => errs.push(invalid(
            child(path, "x-kubernetes-preserve-unknown-fields"),
            other,
            "must be true or undefined",
        )),
        _ => {}
    }
    if let Some(pattern) = obj.get("pattern").and_then(Value::as_str) {
        match Regex::new(pattern) {
            Ok(re) => node.pattern = Some((pattern.to_owned(), re)),
            Err(e) => errs.push(invalid(
                child(path, "pattern"),
                &json!(pattern),
                &format!("must be a valid regular expression, but isn't: {e}"),
            )),
        }
    }

    // Keywords Kubernetes does not support.
    for (name, message) in [
        ("id", "id is not supported"),
        ("additionalItems", "additionalItems is not supported"),
        ("patternProperties", "patternProperties is not supported"),
        ("definitions", "definitions is not supported"),
        ("dependencies", "dependencies is not supported"),
        ("$ref", "$ref is not supported"),
    ] {
        if obj.get(name).is_some_and(|x| !x.is_null()) {
            errs.push(forbidden(child(path, name), message));
        }
    }
    if flag(v, "uniqueItems") {
        errs.push(forbidden(
            child(path, "uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    if node.default.is_some()
        && let Some(reason) = &ctx.no_defaults
    {
        errs.push(forbidden(child(path, "default"), &format!("must not be set {reason}")));
    }
    if ctx.inside_meta && node.embedded {
        errs.push(forbidden(
            child(path, "x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        ));
    }

    // Children.
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, schema) in props {
            let mut sub = ctx.clone();
            sub.level = Level::Field;
            sub.resource_root = false;
            if (ctx.resource_root || node.embedded)
                && ["apiVersion", "kind", "metadata"].contains(&name.as_str())
            {
                sub.inside_meta = true;
                if ctx.level == Level::Root {
                    sub.no_defaults = Some(format!("in top-level {name}"));
                }
            }
            if node.embedded {
                sub.resource_root = false;
            }
            let parsed = parse_node(schema, &key(&child(path, "properties"), name), &sub, errs);
            node.properties.insert(name.clone(), parsed);
        }
    }
    match obj.get("additionalProperties") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(allows)) => {
            if !node.properties.is_empty() && !allows {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "additionalProperties and properties are mutual exclusive",
                ));
            }
            if *allows {
                node.additional = Some(Box::default());
            }
        }
        Some(schema) => {
            if !node.properties.is_empty() {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "additionalProperties and properties are mutual exclusive",
                ));
            }
            if ctx.level == Level::Root && !ctx.nested {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "must not be used at the root",
                ));
            }
            if ctx.nested {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "must be undefined to be structural",
                ));
            }
            let mut sub = ctx.clone();
            sub.level = Level::Field;
            sub.resource_root = false;
            if ctx.inside_meta {
                sub.no_defaults =
                    Some("inside additionalProperties applying to object metadata".to_owned());
            }
            node.additional = Some(Box::new(parse_node(
                schema,
                &child(path, "additionalProperties"),
                &sub,
                errs,
            )));
        }
    }
    match obj.get("items") {
        None | Some(Value::Null) => {}
        Some(Value::Array(_)) => errs.push(forbidden(
            child(path, "items"),
            "items must be a schema object and not an array",
        )),
        Some(schema) => {
            let mut sub = ctx.clone();
            sub.level = Level::Item;
            sub.resource_root = false;
            node.items = Some(Box::new(parse_node(schema, &child(path, "items"), &sub, errs)));
        }
    }
    for (name, list) in
        [("allOf", &mut node.all_of), ("anyOf", &mut node.any_of), ("oneOf", &mut node.one_of)]
    {
        for (i, schema) in obj.get(name).and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            let mut sub = ctx.clone();
            sub.nested = true;
            sub.nested_rules = name == "allOf" && (!ctx.nested || ctx.nested_rules);
            list.push(parse_node(schema, &index(&child(path, name), i), &sub, errs));
        }
    }
    if let Some(schema) = obj.get("not").filter(|n| !n.is_null()) {
        let mut sub = ctx.clone();
        sub.nested = true;
        sub.nested_rules = false;
        node.not = Some(Box::new(parse_node(schema, &child(path, "not"), &sub, errs)));
    }

    if ctx.nested {
        check_nested(obj, &node, path, ctx, errs);
    } else {
        check_structural(&node, path, ctx, errs);
    }
    check_extensions(&node, path, errs);
    node
}

/// The rules of the structural part of a schema.
fn check_structural(node: &Node, path: &str, ctx: &Ctx, errs: &mut Vec<FieldError>) {
    if node.ty == Some(SchemaType::Array) && node.items.is_none() {
        errs.push(required(child(path, "items"), "must be specified"));
    }
    if node.embedded && node.ty != Some(SchemaType::Object) {
        match node.ty {
            None => errs.push(required(
                child(path, "type"),
                "must be object if x-kubernetes-embedded-resource is true",
            )),
            Some(t) => errs.push(invalid(
                child(path, "type"),
                &json!(t.name()),
                "must be object if x-kubernetes-embedded-resource is true",
            )),
        }
    } else if node.ty.is_none() && !node.int_or_string && !node.preserve_unknown {
        let detail = match ctx.level {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(required(child(path, "type"), detail));
    }
    if node.embedded && node.additional.is_some() {
        errs.push(forbidden(
            child(path, "additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if ctx.level == Level::Root && node.ty.is_some_and(|t| t != SchemaType::Object) {
        errs.push(invalid(
            child(path, "type"),
            &json!(node.ty.map(SchemaType::name)),
            "must be object at the root",
        ));
    }
    let check_meta = ctx.level == Level::Root || node.embedded;
    if check_meta {
        for name in ["kind", "apiVersion"] {
            if let Some(p) = node.properties.get(name)
                && p.ty != Some(SchemaType::String)
            {
                errs.push(invalid(
                    child(&key(&child(path, "properties"), name), "type"),
                    &json!(p.ty.map_or("", SchemaType::name)),
                    "must be string",
                ));
            }
        }
    }
    if let Some(meta) = node.properties.get("metadata") {
        let meta_path = key(&child(path, "properties"), "metadata");
        if check_meta && meta.ty != Some(SchemaType::Object) {
            errs.push(invalid(
                child(&meta_path, "type"),
                &json!(meta.ty.map_or("", SchemaType::name)),
                "must be object",
            ));
        }
        if ctx.level == Level::Root {
            let only_names = meta.properties.keys().all(|k| k == "name" || k == "generateName");
            let plain = meta.additional.is_none()
                && meta.items.is_none()
                && meta.required.is_empty()
                && meta.enumeration.is_none()
                && meta.raw_rules.is_empty()
                && meta.all_of.is_empty()
                && meta.any_of.is_empty()
                && meta.one_of.is_empty()
                && meta.not.is_none()
                && !meta.preserve_unknown
                && !meta.embedded
                && meta.list_type.is_none()
                && meta.map_type.is_none();
            if !only_names || !plain {
                errs.push(forbidden(
                    meta_path,
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
            }
        }
    }
    if node.embedded && !node.preserve_unknown && node.properties.is_empty() {
        errs.push(required(
            child(path, "properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
    // Value validations must not name fields the structural part does not have.
    for (name, list) in [("allOf", &node.all_of), ("anyOf", &node.any_of), ("oneOf", &node.one_of)]
    {
        for (i, nested) in list.iter().enumerate() {
            check_complete(nested, node, path, &index(&child(path, name), i), errs);
        }
    }
    if let Some(not) = &node.not {
        check_complete(not, node, path, &child(path, "not"), errs);
    }
}

fn check_complete(
    nested: &Node,
    structural: &Node,
    s_path: &str,
    v_path: &str,
    errs: &mut Vec<FieldError>,
) {
    for (name, sub) in &nested.properties {
        let v_child = key(&child(v_path, "properties"), name);
        match structural.properties.get(name) {
            Some(s) => {
                check_complete(sub, s, &key(&child(s_path, "properties"), name), &v_child, errs);
            }
            None => errs.push(required(
                key(&child(s_path, "properties"), name),
                &format!("because it is defined in {v_child}"),
            )),
        }
    }
    if let Some(items) = &nested.items {
        match &structural.items {
            Some(s) => {
                check_complete(items, s, &child(s_path, "items"), &child(v_path, "items"), errs);
            }
            None => errs.push(required(
                child(s_path, "items"),
                &format!("because it is defined in {}", child(v_path, "items")),
            )),
        }
    }
    for (name, list) in
        [("allOf", &nested.all_of), ("anyOf", &nested.any_of), ("oneOf", &nested.one_of)]
    {
        for (i, n) in list.iter().enumerate() {
            check_complete(n, structural, s_path, &index(&child(v_path, name), i), errs);
        }
    }
}

/// What value validations (inside `allOf`, `anyOf`, `oneOf`, `not`) may not carry.
fn check_nested(
    obj: &serde_json::Map<String, Value>,
    node: &Node,
    path: &str,
    ctx: &Ctx,
    errs: &mut Vec<FieldError>,
) {
    if node.ty.is_some() {
        errs.push(forbidden(child(path, "type"), "must be empty to be structural"));
    }
    if node.default.is_some() {
        errs.push(forbidden(child(path, "default"), "must be undefined to be structural"));
    }
    for name in ["title", "description"] {
        if obj.get(name).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            errs.push(forbidden(child(path, name), "must be empty to be structural"));
        }
    }
    if node.nullable {
        errs.push(forbidden(child(path, "nullable"), "must be false to be structural"));
    }
    for (name, set, message) in [
        (
            "x-kubernetes-preserve-unknown-fields",
            node.preserve_unknown,
            "must be false to be structural",
        ),
        ("x-kubernetes-embedded-resource", node.embedded, "must be false to be structural"),
        ("x-kubernetes-int-or-string", node.int_or_string, "must be false to be structural"),
        (
            "x-kubernetes-list-map-keys",
            !node.list_map_keys.is_empty(),
            "must be empty to be structural",
        ),
        ("x-kubernetes-list-type", node.list_type.is_some(), "must be undefined to be structural"),
        ("x-kubernetes-map-type", node.map_type.is_some(), "must be undefined to be structural"),
        (
            "x-kubernetes-validations",
            !node.raw_rules.is_empty() && !ctx.nested_rules,
            "must be empty to be structural",
        ),
    ] {
        if set {
            errs.push(forbidden(child(path, name), message));
        }
    }
    if node.properties.contains_key("metadata") {
        errs.push(forbidden(
            key(&child(path, "properties"), "metadata"),
            "must not be specified in a nested context",
        ));
    }
}

/// The `x-kubernetes-*` list and map types.
fn check_extensions(node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if node.int_or_string && node.preserve_unknown {
        errs.push(invalid(
            child(path, "x-kubernetes-preserve-unknown-fields"),
            &json!(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if node.int_or_string && node.embedded {
        errs.push(invalid(
            child(path, "x-kubernetes-embedded-resource"),
            &json!(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if let Some(map_type) = &node.map_type {
        match node.ty {
            Some(SchemaType::Object) => {}
            None => errs.push(required(
                child(path, "type"),
                "must be object if x-kubernetes-map-type is specified",
            )),
            Some(t) => errs.push(invalid(
                child(path, "type"),
                &json!(t.name()),
                "must be object if x-kubernetes-map-type is specified",
            )),
        }
        if map_type != "atomic" && map_type != "granular" {
            errs.push(not_supported(
                child(path, "x-kubernetes-map-type"),
                &json!(map_type),
                &["atomic".into(), "granular".into()],
            ));
        }
    }
    if let Some(list_type) = &node.list_type {
        match node.ty {
            Some(SchemaType::Array) => {}
            None => errs.push(required(
                child(path, "type"),
                "must be array if x-kubernetes-list-type is specified",
            )),
            Some(t) => errs.push(invalid(
                child(path, "type"),
                &json!(t.name()),
                "must be array if x-kubernetes-list-type is specified",
            )),
        }
        match list_type.as_str() {
            "atomic" => {}
            "set" => {
                if let Some(items) = &node.items {
                    if items.ty == Some(SchemaType::Object)
                        && items.map_type.as_deref() != Some("atomic")
                    {
                        errs.push(invalid(
                            child(&child(path, "items"), "x-kubernetes-map-type"),
                            &json!(items.map_type),
                            "must be atomic as item of a list with x-kubernetes-list-type=set",
                        ));
                    }
                    if items.ty == Some(SchemaType::Array)
                        && items.list_type.as_deref() != Some("atomic")
                    {
                        errs.push(invalid(
                            child(&child(path, "items"), "x-kubernetes-list-type"),
                            &json!(items.list_type),
                            "must be atomic as item of a list with x-kubernetes-list-type=set",
                        ));
                    }
                    if items.nullable {
                        errs.push(forbidden(
                            child(&child(path, "items"), "nullable"),
                            "cannot be nullable when x-kubernetes-list-type is set",
                        ));
                    }
                }
            }
            "map" => check_map_list(node, path, errs),
            other => errs.push(not_supported(
                child(path, "x-kubernetes-list-type"),
                &json!(other),
                &["atomic".into(), "set".into(), "map".into()],
            )),
        }
    }
    if !node.list_map_keys.is_empty() && node.list_type.as_deref() != Some("map") {
        match &node.list_type {
            None => errs.push(required(
                child(path, "x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            Some(t) => errs.push(invalid(
                child(path, "x-kubernetes-list-type"),
                &json!(t),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
        }
    }
}

fn check_map_list(node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if node.list_map_keys.is_empty() {
        errs.push(required(
            child(path, "x-kubernetes-list-map-keys"),
            "must not be empty if x-kubernetes-list-type is map",
        ));
    }
    let Some(items) = &node.items else {
        errs.push(required(
            child(path, "items"),
            "must have a schema if x-kubernetes-list-type is map",
        ));
        return;
    };
    let items_path = child(path, "items");
    if items.ty != Some(SchemaType::Object) {
        errs.push(invalid(
            child(&items_path, "type"),
            &json!(items.ty.map_or("", SchemaType::name)),
            "must be object if parent array's x-kubernetes-list-type is map",
        ));
        return;
    }
    if items.nullable {
        errs.push(forbidden(
            child(&items_path, "nullable"),
            "cannot be nullable when x-kubernetes-list-type is map",
        ));
    }
    let mut seen = Vec::new();
    for k in &node.list_map_keys {
        if seen.contains(&k) {
            errs.push(invalid(
                child(path, "x-kubernetes-list-map-keys"),
                &json!(node.list_map_keys),
                "must not contain duplicate entries",
            ));
        }
        seen.push(k);
        let Some(prop) = items.properties.get(k) else {
            errs.push(invalid(
                child(path, "x-kubernetes-list-map-keys"),
                &json!(node.list_map_keys),
                "entries must all be names of item properties",
            ));
            continue;
        };
        let prop_path = key(&child(&items_path, "properties"), k);
        if matches!(prop.ty, Some(SchemaType::Object | SchemaType::Array) | None)
            && !prop.int_or_string
        {
            errs.push(invalid(
                child(&prop_path, "type"),
                &json!(prop.ty.map_or("", SchemaType::name)),
                "must be a scalar type if parent array's x-kubernetes-list-type is map",
            ));
        }
        if !items.required.contains(k) && prop.default.is_none() {
            errs.push(required(
                child(&prop_path, "default"),
                "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
            ));
        }
        if prop.nullable {
            errs.push(forbidden(
                child(&prop_path, "nullable"),
                "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
            ));
        }
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
