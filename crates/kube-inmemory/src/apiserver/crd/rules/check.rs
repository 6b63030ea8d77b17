//! The check of a rule's expression when it is compiled: what cel-go's checker would
//! reject where it matters most (syntax, unknown variables and functions, fields the
//! schema does not have), reported with cel-go's positions.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr};
use cel::{Context, Program};

use super::ENV;
use crate::apiserver::crd::netlib;
use crate::apiserver::crd::schema::{Node, SchemaType};

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
pub(super) fn compile_expression(
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
