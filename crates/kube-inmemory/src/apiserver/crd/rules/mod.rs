//! `x-kubernetes-validations`: CEL rules compiled once when a definition is installed
//! and evaluated at the schema node that declares them, with `self` bound to that node's
//! value and `oldSelf` to the correlated old value on updates, as the real API server
//! evaluates them.
//!
//! Compiling checks what cel-go's checker would reject where it matters most: syntax,
//! unknown variables and functions, and fields the schema does not have (`self.privider`).
//! Types are not checked beyond that (a rule comparing a string with an int fails when it
//! runs, as a runtime error); there is no cost estimate or budget.
//!
//! Transition rules (those that mention `oldSelf`) run only on updates and only where an
//! old value correlates (map keys, `map` list keys), unless `optionalOldSelf` binds
//! `oldSelf` as an optional. A rule that fails at runtime is an Invalid cause at its
//! node. Failures of rules that do not use `oldSelf` on values the update did not change
//! are warnings, not errors (CRDValidationRatcheting).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr};
use cel::objects::OptionalValue;
use cel::{Context, Env, Program};
use serde_json::{Value, json};

use super::field::{
    child, duplicate, forbidden, index, invalid, invalid_omitted, key, not_supported, required,
};
use super::netlib;
use super::schema::{Node, SchemaType};
use crate::apiserver::error::FieldError;

/// The CEL environment of CRD rules: the standard library, the strings extension and
/// the Kubernetes IP, CIDR and list libraries.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Declaring a library on a fresh environment cannot conflict.
    env.add_extension(cel::extensions::strings).expect("the strings extension declares once");
    env.add_extension(netlib::extension).expect("the network library declares once");
    Arc::new(env)
});

/// `reason`s a rule may give.
const REASONS: [&str; 4] =
    ["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"];

/// The most bytes of an evaluated `messageExpression` (upstream's limit).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// A compiled `x-kubernetes-validations` entry.
pub(crate) struct Rule {
    /// `rule`, trimmed.
    pub(crate) source: String,
    program: Program,
    /// `message`, trimmed.
    message: Option<String>,
    /// `messageExpression` (source, program).
    message_expression: Option<Program>,
    /// `fieldPath`, normalised (`provider`, `labels[a]`).
    field_path: Option<String>,
    /// `reason`.
    reason: Option<String>,
    /// `optionalOldSelf`.
    optional_old_self: bool,
    /// Whether the rule (or its message expression) mentions `oldSelf`.
    pub(crate) uses_old_self: bool,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule").field("source", &self.source).finish_non_exhaustive()
    }
}

impl Rule {
    /// What upstream calls the rule in error messages: the message, else the rule.
    fn error_string(&self) -> &str {
        self.message.as_deref().unwrap_or(&self.source)
    }
}

// ---------------------------------------------------------------------------------------
// Compiling

/// Whether `name` is a function the environment declares (global or member).
fn is_function(name: &str) -> bool {
    static KNOWN: LazyLock<std::sync::Mutex<HashMap<String, bool>>> =
        LazyLock::new(Default::default);
    let mut known = KNOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *known.entry(name.to_owned()).or_insert_with(|| {
        // The context refuses a function the environment already declares: that is how
        // the environment can be asked.
        let mut probe = Context::with_env(Arc::clone(&ENV));
        netlib::FUNCTIONS.contains(&name) || probe.add_function(name, |x: i64| x).is_err()
    })
}

fn is_operator(name: &str) -> bool {
    name.starts_with('_') || name.starts_with('@') || name == "!_" || name == "-_"
}

const TYPE_NAMES: [&str; 11] =
    ["int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type", "dyn"];

/// What an expression is known to denote, for the field check.
#[derive(Clone, Copy)]
enum Hint<'n> {
    /// A value of this schema node (`true`: the resource root).
    Node(&'n Node, bool),
    /// The root's `metadata` (only `name` and `generateName` are visible to rules).
    Meta,
    /// Anything.
    Unknown,
}

/// The dotted name an expression spells (`ip`, `a.b`), if it is one.
fn qualified_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(s) if !s.test => {
            Some(format!("{}.{}", qualified_name(&s.operand.expr)?, s.field))
        }
        _ => None,
    }
}

struct Checker<'p> {
    program: &'p Program,
    source: &'p str,
    optional_old_self: bool,
    uses_old_self: bool,
    errors: Vec<String>,
}

impl Checker<'_> {
    fn error(&mut self, id: u64, message: &str) {
        // cel-go's position: 1-based line and column of the node's first character.
        let at =
            self.program.source_info().offset_for(id).map_or_else(String::new, |(start, _)| {
                let before = self.source.get(..start as usize).unwrap_or_default();
                let line = before.matches('\n').count() + 1;
                let col = before.rfind('\n').map_or(before.len(), |nl| before.len() - nl - 1) + 1;
                format!("{line}:{col}: ")
            });
        self.errors.push(format!("ERROR: <input>:{at}{message}"));
    }

    fn select<'n>(&mut self, id: u64, on: Hint<'n>, field: &str) -> Hint<'n> {
        match on {
            Hint::Unknown => Hint::Unknown,
            Hint::Meta => {
                if field != "name" && field != "generateName" {
                    self.error(id, &format!("undefined field '{field}'"));
                }
                Hint::Unknown
            }
            Hint::Node(n, root) => {
                if root && field == "metadata" {
                    return Hint::Meta;
                }
                if root && (field == "apiVersion" || field == "kind") {
                    return Hint::Unknown;
                }
                if let Some(p) = n.properties.get(field) {
                    return Hint::Node(p, p.embedded);
                }
                if let Some(extra) = n.additional.as_deref() {
                    return Hint::Node(extra, extra.embedded);
                }
                if n.preserve_unknown || n.int_or_string || n.ty.is_none() {
                    return Hint::Unknown;
                }
                match n.ty {
                    Some(SchemaType::Object) => {
                        self.error(id, &format!("undefined field '{field}'"));
                    }
                    Some(t) => self.error(
                        id,
                        &format!("type '{}' does not support field selection", t.name()),
                    ),
                    None => {}
                }
                Hint::Unknown
            }
        }
    }

    fn call<'n>(
        &mut self,
        id: u64,
        call: &CallExpr,
        scope: &mut Vec<(String, Hint<'n>)>,
        this: Hint<'n>,
    ) -> Hint<'n> {
        // `ip.isCanonical(x)`: a call whose target spells a namespace is that function.
        if let Some(target) = &call.target
            && let Some(q) = qualified_name(&target.expr)
            && !scope.iter().any(|(n, _)| q.split('.').next() == Some(n.as_str()))
            && q != "self"
            && q != "oldSelf"
            && is_function(&format!("{q}.{}", call.func_name))
        {
            for a in &call.args {
                self.walk(a, scope, this);
            }
            return Hint::Unknown;
        }
        if !is_operator(&call.func_name) && !is_function(&call.func_name) {
            self.error(
                id,
                &format!("undeclared reference to '{}' (in container '')", call.func_name),
            );
        }
        if let Some(t) = &call.target {
            self.walk(t, scope, this);
        }
        let args: Vec<Hint<'n>> = call.args.iter().map(|a| self.walk(a, scope, this)).collect();
        if call.func_name == "_[_]"
            && let Some(Hint::Node(n, _)) = args.first()
        {
            if let Some(items) = n.items.as_deref() {
                return Hint::Node(items, items.embedded);
            }
            if let Some(extra) = n.additional.as_deref() {
                return Hint::Node(extra, extra.embedded);
            }
        }
        Hint::Unknown
    }

    fn walk<'n>(
        &mut self,
        e: &IdedExpr,
        scope: &mut Vec<(String, Hint<'n>)>,
        this: Hint<'n>,
    ) -> Hint<'n> {
        match &e.expr {
            Expr::Ident(name) => {
                if let Some((_, h)) = scope.iter().rev().find(|(n, _)| n == name) {
                    return *h;
                }
                match name.as_str() {
                    "self" => this,
                    "oldSelf" => {
                        self.uses_old_self = true;
                        if self.optional_old_self { Hint::Unknown } else { this }
                    }
                    n if TYPE_NAMES.contains(&n) => Hint::Unknown,
                    n => {
                        self.error(
                            e.id,
                            &format!("undeclared reference to '{n}' (in container '')"),
                        );
                        Hint::Unknown
                    }
                }
            }
            Expr::Select(s) => {
                let on = self.walk(&s.operand, scope, this);
                self.select(e.id, on, &s.field)
            }
            Expr::Call(call) => self.call(e.id, call, scope, this),
            Expr::Comprehension(c) => {
                let range = self.walk(&c.iter_range, scope, this);
                let element = match range {
                    Hint::Node(n, _) if n.ty == Some(SchemaType::Array) => {
                        n.items.as_deref().map_or(Hint::Unknown, |i| Hint::Node(i, i.embedded))
                    }
                    _ => Hint::Unknown,
                };
                self.walk(&c.accu_init, scope, this);
                let depth = scope.len();
                scope.push((c.iter_var.clone(), element));
                if let Some(v2) = &c.iter_var2 {
                    scope.push((v2.clone(), Hint::Unknown));
                }
                scope.push((c.accu_var.clone(), Hint::Unknown));
                self.walk(&c.loop_cond, scope, this);
                self.walk(&c.loop_step, scope, this);
                self.walk(&c.result, scope, this);
                scope.truncate(depth);
                Hint::Unknown
            }
            Expr::List(l) => {
                for el in &l.elements {
                    self.walk(el, scope, this);
                }
                Hint::Unknown
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        self.walk(&me.key, scope, this);
                        self.walk(&me.value, scope, this);
                    }
                }
                Hint::Unknown
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.walk(&f.value, scope, this);
                    }
                }
                Hint::Unknown
            }
            Expr::Literal(_) | Expr::Unspecified => Hint::Unknown,
        }
    }
}

/// Compiles `source` against the schema node it is declared on. Returns the program and
/// whether it mentions `oldSelf`, or cel-go-like error text.
fn compile_expression(
    source: &str,
    node: &Node,
    resource_root: bool,
    optional_old_self: bool,
) -> Result<(Program, bool), String> {
    let program =
        ENV.compile(source).map_err(|e| format!("compilation failed: ERROR: <input>: {e}"))?;
    let mut checker = Checker {
        program: &program,
        source,
        optional_old_self,
        uses_old_self: false,
        errors: Vec::new(),
    };
    checker.walk(program.expression(), &mut Vec::new(), Hint::Node(node, resource_root));
    if !checker.errors.is_empty() {
        return Err(format!("compilation failed: {}", checker.errors.join("\n")));
    }
    let uses = checker.uses_old_self;
    Ok((program, uses))
}

/// Normalises a rule's `fieldPath` (`.provider`, `['a.b']`, `.labels['x']`) against the
/// node, as upstream's `ValidFieldPath` does.
fn normalize_field_path(path: &str, node: &Node) -> Result<String, String> {
    let mut out = String::new();
    let mut n = node;
    let mut rest = path;
    while !rest.is_empty() {
        let name;
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            name = r[..end].to_owned();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or("expected ]")?;
            name = r[..end].replace("\\'", "'").replace("\\\\", "\\");
            rest = &r[end + 2..];
        } else {
            return Err(format!("expected [ or . but got: {rest}"));
        }
        if name.is_empty() {
            return Err("unexpected end of JSON path".into());
        }
        if let Some(p) = n.properties.get(&name) {
            out = child(&out, &name);
            n = p;
        } else if !n.properties.is_empty() || n.additional.is_none() {
            return Err("does not refer to a valid field".into());
        } else if let Some(extra) = n.additional.as_deref() {
            out = format!("{out}[{name}]");
            n = extra;
        }
    }
    Ok(out)
}

/// Compiles every `x-kubernetes-validations` entry of `node` and below (`path` is the
/// node's place in the definition). `uncorrelatable` names the list whose items have no
/// old value to compare with, where `oldSelf` is refused.
pub(crate) fn compile_all(
    node: &mut Node,
    path: &str,
    resource_root: bool,
    uncorrelatable: Option<&str>,
    errs: &mut Vec<FieldError>,
) {
    let rules = compile_node(node, node, path, resource_root, uncorrelatable, errs);
    node.rules = rules;
    for (name, prop) in &mut node.properties {
        let p = key(&child(path, "properties"), name);
        let embedded = prop.embedded;
        compile_all(prop, &p, embedded, uncorrelatable, errs);
    }
    if let Some(extra) = node.additional.as_deref_mut() {
        let embedded = extra.embedded;
        compile_all(extra, &child(path, "additionalProperties"), embedded, uncorrelatable, errs);
    }
    let items_uncorrelatable = if node.list_type.as_deref() == Some("map") {
        uncorrelatable.map(str::to_owned)
    } else {
        Some(uncorrelatable.map_or_else(|| path.to_owned(), str::to_owned))
    };
    if let Some(items) = node.items.as_deref_mut() {
        let embedded = items.embedded;
        compile_all(items, &child(path, "items"), embedded, items_uncorrelatable.as_deref(), errs);
    }
    // Rules in `allOf` run at this node's value.
    let mut all_of = std::mem::take(&mut node.all_of);
    for (i, nested) in all_of.iter_mut().enumerate() {
        nested.rules = compile_node(
            nested,
            node,
            &index(&child(path, "allOf"), i),
            resource_root,
            uncorrelatable,
            errs,
        );
    }
    node.all_of = all_of;
}

/// The fields of a `x-kubernetes-validations` entry, checked.
struct Entry {
    rule: String,
    message: Option<String>,
    message_expression: Option<String>,
    reason: Option<String>,
    field_path: Option<String>,
}

/// Checks an entry's fields other than the expressions (`at`: its path).
fn check_entry(
    raw: &Value,
    at: &str,
    structural: &Node,
    errs: &mut Vec<FieldError>,
) -> Option<Entry> {
    let text = |name: &str| raw.get(name).and_then(Value::as_str).map(str::to_owned);
    let source = text("rule").unwrap_or_default();
    let trimmed = source.trim().to_owned();
    let message = text("message");
    let message_trimmed = message.as_deref().map(str::trim);
    let mut ok = true;
    if trimmed.is_empty() {
        errs.push(required(child(at, "rule"), "rule is not specified"));
        ok = false;
    } else if message.as_deref().is_some_and(|m| !m.is_empty()) && message_trimmed == Some("") {
        errs.push(invalid(child(at, "message"), &json!(message), "must be non-empty if specified"));
        ok = false;
    } else if message_trimmed.is_some_and(|m| m.contains('\n')) {
        errs.push(invalid(child(at, "message"), &json!(message), "must not contain line breaks"));
        ok = false;
    } else if trimmed.contains('\n') && message_trimmed.is_none_or(str::is_empty) {
        errs.push(required(
            child(at, "message"),
            "message must be specified if rule contains line breaks",
        ));
        ok = false;
    }
    let message_expression = text("messageExpression");
    if message_expression.as_deref().is_some_and(|m| !m.is_empty() && m.trim().is_empty()) {
        errs.push(required(
            child(at, "messageExpression"),
            "messageExpression must be non-empty if specified",
        ));
        ok = false;
    }
    let reason = text("reason");
    if let Some(r) = &reason
        && !REASONS.contains(&r.as_str())
    {
        errs.push(not_supported(child(at, "reason"), &json!(r), &REASONS.map(str::to_owned)));
        ok = false;
    }
    let field_path = match text("fieldPath") {
        Some(fp) if fp.trim().is_empty() => {
            errs.push(invalid(
                child(at, "fieldPath"),
                &json!(fp),
                "must be non-empty if specified",
            ));
            ok = false;
            None
        }
        Some(fp) if fp.contains('\n') => {
            errs.push(invalid(child(at, "fieldPath"), &json!(fp), "must not contain line breaks"));
            ok = false;
            None
        }
        Some(fp) => {
            let normalized = normalize_field_path(fp.trim(), structural).ok();
            if normalized.is_none() {
                errs.push(invalid(child(at, "fieldPath"), &json!(fp), "must be a valid path"));
                ok = false;
            }
            normalized
        }
        None => None,
    };
    ok.then_some(Entry { rule: trimmed, message, message_expression, reason, field_path })
}

fn compile_node(
    declared: &Node,
    structural: &Node,
    path: &str,
    resource_root: bool,
    uncorrelatable: Option<&str>,
    errs: &mut Vec<FieldError>,
) -> Vec<Rule> {
    let mut out = Vec::new();
    for (i, raw) in declared.raw_rules.iter().enumerate() {
        let at = index(&child(path, "x-kubernetes-validations"), i);
        let Some(entry) = check_entry(raw, &at, structural, errs) else { continue };
        let Entry { rule: trimmed, message, message_expression, reason, field_path } = entry;
        let optional_old_self = raw.get("optionalOldSelf").and_then(Value::as_bool);
        let compiled = compile_expression(
            &trimmed,
            structural,
            resource_root,
            optional_old_self == Some(true),
        );
        let (program, mut uses_old_self) = match compiled {
            Ok(c) => c,
            Err(detail) => {
                errs.push(invalid(child(&at, "rule"), raw, &detail));
                continue;
            }
        };
        let message_program =
            match message_expression.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
                Some(src) => match compile_expression(
                    src,
                    structural,
                    resource_root,
                    optional_old_self == Some(true),
                ) {
                    Ok((p, uses)) => {
                        uses_old_self |= uses;
                        Some(p)
                    }
                    Err(detail) => {
                        errs.push(invalid(child(&at, "messageExpression"), raw, &detail));
                        continue;
                    }
                },
                None => None,
            };
        if uses_old_self {
            if let Some(list) = uncorrelatable {
                errs.push(invalid(
                    child(&at, "rule"),
                    &json!(trimmed),
                    &format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {list}"),
                ));
                continue;
            }
        } else if let Some(flag) = optional_old_self {
            errs.push(invalid(
                child(&at, "optionalOldSelf"),
                &json!(flag),
                "may not be set if oldSelf is not used in rule",
            ));
            continue;
        }
        out.push(Rule {
            source: trimmed,
            program,
            message: message.map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()),
            message_expression: message_program,
            field_path,
            reason,
            optional_old_self: optional_old_self == Some(true),
            uses_old_self,
        });
    }
    out
}

// ---------------------------------------------------------------------------------------
// Evaluating

/// A JSON value as CEL sees it under `node`: integers as `int`, `number` fields as
/// `double`, objects as maps; at a resource root `metadata` shows only `name` and
/// `generateName`, as upstream exposes it.
fn to_cel(v: &Value, node: Option<&Node>, resource_root: bool) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => {
            let double = node.is_some_and(|s| s.ty == Some(SchemaType::Number));
            match (n.as_i64(), n.as_u64()) {
                (Some(i), _) if !double => cel::Value::Int(i),
                (None, Some(u)) if !double => cel::Value::UInt(u),
                _ => cel::Value::Float(n.as_f64().unwrap_or(0.0)),
            }
        }
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => {
            let item = node.and_then(|n| n.items.as_deref());
            cel::Value::List(Arc::new(
                items.iter().map(|i| to_cel(i, item, item.is_some_and(|n| n.embedded))).collect(),
            ))
        }
        Value::Object(m) => {
            let mut out: HashMap<String, cel::Value> = HashMap::with_capacity(m.len());
            for (k, child_v) in m {
                if resource_root && k == "metadata" {
                    let mut meta: HashMap<String, cel::Value> = HashMap::new();
                    for f in ["name", "generateName"] {
                        if let Some(Value::String(s)) = child_v.get(f) {
                            meta.insert(f.to_owned(), cel::Value::String(Arc::new(s.clone())));
                        }
                    }
                    out.insert(k.clone(), meta.into());
                    continue;
                }
                let sub = node.and_then(|n| n.field(k));
                out.insert(k.clone(), to_cel(child_v, sub, sub.is_some_and(|n| n.embedded)));
            }
            out.into()
        }
    }
}

/// Where a rule's errors go.
struct Outcome {
    errors: Vec<FieldError>,
    warnings: Vec<String>,
}

/// Evaluates every rule of `root` on `obj` (an update when `old` is given). Returns the
/// errors and the warnings of ratcheted failures.
pub(crate) fn validate(
    root: &Node,
    obj: &Value,
    old: Option<&Value>,
) -> (Vec<FieldError>, Vec<String>) {
    let mut out = Outcome { errors: Vec::new(), warnings: Vec::new() };
    if root.has_rules() {
        let context = Context::with_env(Arc::clone(&ENV));
        let unchanged = old.is_some_and(|o| o == obj);
        walk(root, obj, old, None, true, unchanged, &context, &mut out);
    }
    (out.errors, out.warnings)
}

/// Evaluates the rules of `node` and below on a value found at `path` (a schema
/// default, say).
pub(crate) fn validate_at(
    node: &Node,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    resource_root: bool,
) -> (Vec<FieldError>, Vec<String>) {
    let mut out = Outcome { errors: Vec::new(), warnings: Vec::new() };
    if node.has_rules() {
        let context = Context::with_env(Arc::clone(&ENV));
        let unchanged = old.is_some_and(|o| o == value);
        walk(node, value, old, Some(path), resource_root, unchanged, &context, &mut out);
    }
    (out.errors, out.warnings)
}

#[allow(clippy::too_many_arguments, reason = "the walk's state, threaded through the recursion")]
fn walk(
    node: &Node,
    v: &Value,
    old: Option<&Value>,
    path: Option<&str>,
    resource_root: bool,
    unchanged: bool,
    context: &Context<'_, '_>,
    out: &mut Outcome,
) {
    if v.is_null() || !node.has_rules() {
        return;
    }
    let mut self_value = None;
    for rule in node.rules.iter().chain(node.all_of.iter().flat_map(|n| n.rules.iter())) {
        let self_cel =
            self_value.get_or_insert_with(|| to_cel(v, Some(node), resource_root)).clone();
        evaluate(rule, node, v, self_cel, old, path, resource_root, unchanged, context, out);
    }
    match v {
        Value::Object(m) => {
            let old_map = old.and_then(Value::as_object);
            for (k, child_v) in m {
                let Some(sub) = node.properties.get(k).or(node.additional.as_deref()) else {
                    continue;
                };
                if resource_root && ["apiVersion", "kind", "metadata"].contains(&k.as_str()) {
                    continue;
                }
                let old_child = old_map.and_then(|o| o.get(k));
                let child_path = match path {
                    None => k.clone(),
                    Some(p) if node.properties.contains_key(k) => child(p, k),
                    Some(p) => key(p, k),
                };
                let child_unchanged = old_child.map_or(unchanged, |o| o == child_v);
                walk(
                    sub,
                    child_v,
                    old_child,
                    Some(&child_path),
                    sub.embedded,
                    child_unchanged,
                    context,
                    out,
                );
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = node.items.as_deref() else { return };
            let old_items = old.and_then(Value::as_array);
            for (i, item) in items.iter().enumerate() {
                let old_item = match (node.map_keys(), old_items) {
                    (Some(keys), Some(olds)) => {
                        olds.iter().find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
                    }
                    _ => None,
                };
                let item_path = index(path.unwrap_or("<nil>"), i);
                let item_unchanged = old_item.map_or(unchanged, |o| o == item);
                walk(
                    item_schema,
                    item,
                    old_item,
                    Some(&item_path),
                    item_schema.embedded,
                    item_unchanged,
                    context,
                    out,
                );
            }
        }
        _ => {}
    }
}

#[allow(clippy::too_many_arguments, reason = "the walk's state for one rule")]
fn evaluate(
    rule: &Rule,
    node: &Node,
    v: &Value,
    self_cel: cel::Value,
    old: Option<&Value>,
    path: Option<&str>,
    resource_root: bool,
    unchanged: bool,
    context: &Context<'_, '_>,
    out: &mut Outcome,
) {
    if rule.uses_old_self && old.is_none() && !rule.optional_old_self {
        return;
    }
    let mut scope = context.new_inner_scope();
    scope.add_variable_from_value("self", self_cel);
    if rule.uses_old_self {
        let old_cel = old.map(|o| to_cel(o, Some(node), resource_root));
        if rule.optional_old_self {
            let optional = match old_cel {
                Some(o) => OptionalValue::of(o),
                None => OptionalValue::none(),
            };
            scope.add_variable_from_value("oldSelf", cel::Value::Opaque(Arc::new(optional)));
        } else if let Some(o) = old_cel {
            scope.add_variable_from_value("oldSelf", o);
        }
    }
    let node_field = path.unwrap_or("<nil>").to_owned();
    let node_type = json!(node.ty.map_or("", SchemaType::name));
    let passed = match rule.program.execute(&scope) {
        Ok(cel::Value::Bool(true)) => return,
        Ok(cel::Value::Bool(false)) => false,
        Ok(other) => {
            out.errors.push(invalid(
                &node_field,
                &node_type,
                &format!(
                    "rule did not evaluate to a bool (got {other:?}) evaluating rule: {}",
                    rule.error_string()
                ),
            ));
            return;
        }
        Err(e) => {
            out.errors.push(invalid(
                &node_field,
                &node_type,
                &format!("{e} evaluating rule: {}", rule.error_string()),
            ));
            return;
        }
    };
    debug_assert!(!passed);
    let detail = rule
        .message_expression
        .as_ref()
        .and_then(|p| match p.execute(&scope) {
            Ok(cel::Value::String(s)) => {
                let t = s.trim();
                (!t.is_empty() && !t.contains('\n') && t.len() <= MAX_MESSAGE_BYTES)
                    .then(|| t.to_owned())
            }
            _ => None,
        })
        .unwrap_or_else(|| match &rule.message {
            Some(m) => m.clone(),
            None => format!("failed rule: {}", rule.source),
        });
    let field = match (&rule.field_path, path) {
        (Some(fp), Some(p)) => child(p, fp),
        (Some(fp), None) => fp.clone(),
        (None, _) => node_field,
    };
    let scalar = !matches!(v, Value::Object(_) | Value::Array(_));
    let error = match rule.reason.as_deref() {
        Some("FieldValueForbidden") => forbidden(&field, &detail),
        Some("FieldValueRequired") => required(&field, &detail),
        Some("FieldValueDuplicate") if scalar => duplicate(&field, v),
        Some("FieldValueDuplicate") => FieldError {
            reason: "FieldValueDuplicate",
            field: field.clone(),
            message: "Duplicate value".to_owned(),
        },
        _ if scalar => invalid(&field, v, &detail),
        _ => invalid_omitted(&field, &detail),
    };
    if !rule.uses_old_self && unchanged {
        out.warnings.push(format!("{}: {}", error.field, error.message));
    } else {
        out.errors.push(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::crd::schema;

    fn compiled(s: &Value) -> Result<Node, Vec<String>> {
        let mut errs = Vec::new();
        let mut parsed = schema::parse(s, "s", &mut errs);
        compile_all(&mut parsed.root, "s", true, None, &mut errs);
        if errs.is_empty() {
            Ok(parsed.root)
        } else {
            Err(errs.iter().map(|e| format!("{}: {}", e.field, e.message)).collect())
        }
    }

    fn spec_with(rules: &Value) -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-validations": rules,
            "properties": {"a": {"type": "string"}, "n": {"type": "integer"},
                           "list": {"type": "array", "items": {"type": "string"}}}}}})
    }

    fn run(node: &Node, obj: &Value, old: Option<&Value>) -> Vec<String> {
        let (errs, warnings) = validate(node, obj, old);
        errs.iter()
            .map(|e| format!("{} {}: {}", e.reason, e.field, e.message))
            .chain(warnings.into_iter().map(|w| format!("warning {w}")))
            .collect()
    }

    #[test]
    fn compile_errors_name_the_rule() {
        let e = compiled(&spec_with(&json!([{"rule": "self.b == 1"}]))).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("s.properties[spec].x-kubernetes-validations[0].rule: Invalid value: {\"rule\":\"self.b == 1\"}: compilation failed: ERROR: <input>:1:5: undefined field 'b'"), "{e:?}");
        let e = compiled(&spec_with(&json!([{"rule": "self.a =="}]))).unwrap_err();
        assert!(e[0].contains("compilation failed"), "{e:?}");
        let e = compiled(&spec_with(&json!([{"rule": "nope(self.a)"}]))).unwrap_err();
        assert!(e[0].contains("undeclared reference to 'nope'"), "{e:?}");
        let e = compiled(&spec_with(&json!([{"rule": "self.a == x"}]))).unwrap_err();
        assert!(e[0].contains("undeclared reference to 'x'"), "{e:?}");
        let e =
            compiled(&spec_with(&json!([{"rule": "true", "optionalOldSelf": true}]))).unwrap_err();
        assert!(e[0].contains("optionalOldSelf: Invalid value: true: may not be set if oldSelf is not used in rule"), "{e:?}");
        let e = compiled(&json!({"type": "object", "properties": {"l": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}})).unwrap_err();
        assert!(e[0].contains("oldSelf cannot be used on the uncorrelatable portion of the schema within s.properties[l]"), "{e:?}");
        assert!(compiled(&spec_with(&json!([{"rule": "self.list.all(x, x.startsWith('a')) && ip.isCanonical('::1') && cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))"}]))).is_ok());
    }

    #[test]
    fn rules_evaluate_with_messages_and_paths() {
        let node = compiled(&spec_with(&json!([
            {"rule": "self.n < 10", "messageExpression": "'n is ' + string(self.n)", "fieldPath": ".n"},
            {"rule": "self.a == oldSelf.a", "message": "a is immutable", "reason": "FieldValueForbidden"},
            {"rule": "oldSelf.list.all(x, x in self.list)", "message": "list is append-only"},
            {"rule": "isCIDR(self.a) && cidr(self.a).containsIP(ip('10.0.0.1'))", "message": "a must hold 10.0.0.1"},
        ])))
        .unwrap();
        let obj = json!({"spec": {"a": "10.0.0.0/24", "n": 3, "list": ["x"]}});
        assert!(run(&node, &obj, None).is_empty());
        let bad = json!({"spec": {"a": "192.168.0.0/24", "n": 12, "list": []}});
        let got = run(&node, &bad, Some(&obj));
        assert_eq!(
            got,
            [
                "FieldValueInvalid spec.n: Invalid value: n is 12",
                "FieldValueForbidden spec: Forbidden: a is immutable",
                "FieldValueInvalid spec: Invalid value: list is append-only",
                "FieldValueInvalid spec: Invalid value: a must hold 10.0.0.1",
            ]
        );
        // On create the transition rules do not run.
        assert_eq!(run(&node, &bad, None).len(), 2);
    }

    #[test]
    fn runtime_errors_and_ratcheting() {
        let node = compiled(&json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "c": {"type": "string", "x-kubernetes-validations": [{"rule": "cidr(self).prefixLength() > 8", "message": "too big"}]}}}}}))
        .unwrap();
        let got = run(&node, &json!({"spec": {"c": "nope"}}), None);
        assert_eq!(got.len(), 1);
        assert!(
            got[0].starts_with("FieldValueInvalid spec.c: Invalid value: \"string\": "),
            "{got:?}"
        );
        assert!(got[0].ends_with("evaluating rule: too big"), "{got:?}");
        let old = json!({"spec": {"c": "10.0.0.0/8"}});
        let got = run(&node, &old, Some(&old));
        assert_eq!(got, ["warning spec.c: Invalid value: \"10.0.0.0/8\": too big"]);
    }

    fn eval(source: &str) -> Result<cel::Value, String> {
        let program = ENV.compile(source).map_err(|e| e.to_string())?;
        let context = Context::with_env(Arc::clone(&ENV));
        program.execute(&context).map_err(|e| e.to_string())
    }

    #[test]
    fn kubernetes_library_functions() {
        for expr in [
            "ip.isCanonical('2001:db8::abcd')",
            "!ip.isCanonical('2001:DB8::ABCD')",
            "!ip.isCanonical('2001:db8::0:0:0:abcd')",
            "ip('127.0.0.1').family() == 4 && ip('::1').family() == 6",
            "ip('0.0.0.0').isUnspecified() && ip('::1').isLoopback()",
            "ip('224.0.0.1').isLinkLocalMulticast() && ip('ff02::1').isLinkLocalMulticast()",
            "ip('169.254.169.254').isLinkLocalUnicast() && ip('fe80::1').isLinkLocalUnicast()",
            "ip('192.168.0.1').isGlobalUnicast() && !ip('255.255.255.255').isGlobalUnicast()",
            "isIP('10.0.0.1') && !isIP('10.0.0.256') && !isIP('::ffff:1.2.3.4')",
            "isCIDR('10.0.0.0/8') && !isCIDR('10.0.0.0/33') && !isCIDR('10.0.0.0')",
            "cidr('192.168.0.1/24').masked() == cidr('192.168.0.0/24')",
            "cidr('192.168.0.1/24') != cidr('192.168.0.1/24').masked()",
            "cidr('192.168.0.0/24').prefixLength() == 24",
            "cidr('192.168.0.1/24').ip() == ip('192.168.0.1')",
            "cidr('192.168.0.0/16').containsCIDR('192.168.10.0/24')",
            "!cidr('192.168.1.0/24').containsCIDR(cidr('192.168.2.0/24'))",
            "cidr('2001:db8::/32').containsIP('2001:db8::1') && !cidr('2001:db8::/32').containsIP(ip('2001:dc8::1'))",
            "string(cidr('10.0.0.0/8')) == '10.0.0.0/8' && string(ip('::1')) == '::1'",
            "[1, 2, 2, 3].isSorted() && ![2, 1].isSorted()",
            "[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0 && [].sum() == 0",
            "[3, 1, 2].min() == 1 && ['a', 'c', 'b'].max() == 'c'",
            "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1",
            "'abc'.indexOf('c') == 2 && 'a,b'.split(',').size() == 2",
        ] {
            assert_eq!(eval(expr), Ok(cel::Value::Bool(true)), "{expr}");
        }
        for expr in
            ["ip('10.0.0.256')", "cidr('10.0.0.0/33')", "ip.isCanonical('nope')", "[].min()"]
        {
            assert!(eval(expr).is_err(), "{expr} should fail");
        }
    }

    #[test]
    fn optional_old_self() {
        let node = compiled(&spec_with(&json!([
            {"rule": "!oldSelf.hasValue() || oldSelf.value().a == self.a", "optionalOldSelf": true, "message": "fixed"}
        ])))
        .unwrap();
        assert!(run(&node, &json!({"spec": {"a": "x"}}), None).is_empty());
        assert_eq!(
            run(&node, &json!({"spec": {"a": "y"}}), Some(&json!({"spec": {"a": "x"}}))).len(),
            1
        );
    }
}
