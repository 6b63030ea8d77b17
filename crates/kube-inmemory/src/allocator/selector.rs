//! CEL device selectors: compiles DeviceClass and request selectors and evaluates them
//! against one device with the DRA variables and the `quantity()`/`semver()` library.
//!
//! Supported (a subset of the Kubernetes DRA CEL environment):
//! - `device.driver` (string), `device.allowMultipleAllocations` (bool);
//! - `device.attributes["<domain>"].<name>`: attributes grouped by domain; an unqualified
//!   attribute name belongs to the driver's domain. `string`, `int`, `bool` attributes map
//!   to CEL strings, ints and bools; `version` attributes to semver values;
//! - `device.capacity["<domain>"].<name>`: quantity values;
//! - `quantity("1Gi")`, `semver("1.2.3")` (bad text is an evaluation error);
//! - on quantities and semvers: `a.compareTo(b)` (-1/0/1), `a.isGreaterThan(b)`,
//!   `a.isLessThan(b)`, `==`/`!=`; on quantities `q.asInteger()`;
//! - the CEL standard library of the `cel` crate (`in`, `has()`, `size`, `matches`,
//!   `startsWith`, `exists`, `all`, …).
//!
//! Differences from Kubernetes: `<`/`>` do not work on quantities or semvers (use the
//! methods); an unknown domain in `device.attributes[...]` is a "no such key" error rather
//! than an empty map (guard with `"domain" in device.attributes`); there is no cost limit.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::extractors::This;
use cel::objects::Opaque;
use cel::{Context, Env, ExecutionError, FunctionContext, Program, Value};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use super::quantity::Quantity;

/// A selector could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The expression does not parse.
    #[error("CEL expression {expression:?} does not compile: {message}")]
    Compile {
        /// The expression.
        expression: String,
        /// The parser's message.
        message: String,
    },
    /// Evaluation failed (missing key, wrong type, bad quantity text, …).
    #[error("CEL expression {expression:?} failed on device {device}: {message}")]
    Eval {
        /// The expression.
        expression: String,
        /// The device it was evaluated against.
        device: String,
        /// The evaluator's message.
        message: String,
    },
    /// The expression produced something other than a bool.
    #[error("CEL expression {expression:?} returned {got} on device {device}, not a bool")]
    NotBool {
        /// The expression.
        expression: String,
        /// The device it was evaluated against.
        device: String,
        /// What it returned.
        got: String,
    },
}

/// The standard library, built once: building it per evaluation dominated the cost.
static STDLIB: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// A compiled CEL selector.
pub struct Selector {
    expression: String,
    program: Program,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector").field("expression", &self.expression).finish_non_exhaustive()
    }
}

impl Selector {
    /// Compiles `expression`.
    pub fn compile(expression: &str) -> Result<Self, SelectorError> {
        let program = Program::compile(expression).map_err(|e| SelectorError::Compile {
            expression: expression.to_owned(),
            message: e.to_string(),
        })?;
        Ok(Self { expression: expression.to_owned(), program })
    }

    /// The source text.
    #[must_use]
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Whether `device` (published by `driver`) matches.
    pub fn matches(&self, driver: &str, device: &Device) -> Result<bool, SelectorError> {
        let eval_error = |message: String| SelectorError::Eval {
            expression: self.expression.clone(),
            device: device.name.clone(),
            message,
        };
        let mut context = Context::with_env(Arc::clone(&STDLIB));
        register_functions(&mut context).map_err(eval_error)?;
        context.add_variable_from_value("device", device_value(driver, device));
        match self.program.execute(&context) {
            Ok(Value::Bool(matched)) => Ok(matched),
            Ok(other) => Err(SelectorError::NotBool {
                expression: self.expression.clone(),
                device: device.name.clone(),
                got: format!("{other:?}"),
            }),
            Err(e) => Err(eval_error(e.to_string())),
        }
    }
}

/// A quantity inside CEL.
#[derive(Debug, PartialEq, Eq)]
struct CelQuantity(Quantity);

impl Opaque for CelQuantity {
    fn runtime_type_name(&self) -> &'static str {
        "kubernetes.Quantity"
    }
}

/// A semantic version inside CEL.
#[derive(Debug, PartialEq, Eq)]
struct CelSemver(semver::Version);

impl Opaque for CelSemver {
    fn runtime_type_name(&self) -> &'static str {
        "kubernetes.Semver"
    }
}

fn register_functions(context: &mut Context<'_, '_>) -> Result<(), String> {
    let conflict = |e: cel::DeclarationError| format!("registering CEL functions: {e:?}");
    context.add_function("quantity", parse_quantity).map_err(conflict)?;
    context.add_function("semver", parse_semver).map_err(conflict)?;
    context.add_function("compareTo", compare_to).map_err(conflict)?;
    context.add_function("isGreaterThan", is_greater_than).map_err(conflict)?;
    context.add_function("isLessThan", is_less_than).map_err(conflict)?;
    context.add_function("asInteger", as_integer).map_err(conflict)?;
    Ok(())
}

#[allow(clippy::needless_pass_by_value, reason = "cel's extractors hand arguments over by value")]
fn parse_quantity(
    ftx: &FunctionContext<'_, '_>,
    text: Arc<String>,
) -> Result<Value, ExecutionError> {
    let quantity = Quantity::parse(&text).map_err(|e| ftx.error(e))?;
    Ok(Value::Opaque(Arc::new(CelQuantity(quantity))))
}

#[allow(clippy::needless_pass_by_value, reason = "cel's extractors hand arguments over by value")]
fn parse_semver(ftx: &FunctionContext<'_, '_>, text: Arc<String>) -> Result<Value, ExecutionError> {
    let version = semver::Version::parse(&text)
        .map_err(|e| ftx.error(format!("invalid semver {text:?}: {e}")))?;
    Ok(Value::Opaque(Arc::new(CelSemver(version))))
}

fn ordering(
    ftx: &FunctionContext<'_, '_>,
    left: &Value,
    right: &Value,
) -> Result<Ordering, ExecutionError> {
    if let (Value::Opaque(a), Value::Opaque(b)) = (left, right) {
        if let (Some(a), Some(b)) =
            (a.as_ref().downcast_ref::<CelQuantity>(), b.as_ref().downcast_ref::<CelQuantity>())
        {
            return Ok(a.0.cmp(&b.0));
        }
        if let (Some(a), Some(b)) =
            (a.as_ref().downcast_ref::<CelSemver>(), b.as_ref().downcast_ref::<CelSemver>())
        {
            return Ok(a.0.cmp(&b.0));
        }
    }
    Err(ftx.error(format!("needs two quantities or two semvers, got {left:?} and {right:?}")))
}

#[allow(clippy::needless_pass_by_value, reason = "cel's extractors hand arguments over by value")]
fn compare_to(
    ftx: &FunctionContext<'_, '_>,
    This(this): This<Value>,
    other: Value,
) -> Result<Value, ExecutionError> {
    Ok(Value::Int(match ordering(ftx, &this, &other)? {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }))
}

#[allow(clippy::needless_pass_by_value, reason = "cel's extractors hand arguments over by value")]
fn is_greater_than(
    ftx: &FunctionContext<'_, '_>,
    This(this): This<Value>,
    other: Value,
) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(ordering(ftx, &this, &other)? == Ordering::Greater))
}

#[allow(clippy::needless_pass_by_value, reason = "cel's extractors hand arguments over by value")]
fn is_less_than(
    ftx: &FunctionContext<'_, '_>,
    This(this): This<Value>,
    other: Value,
) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(ordering(ftx, &this, &other)? == Ordering::Less))
}

fn as_integer(
    ftx: &FunctionContext<'_, '_>,
    This(this): This<Value>,
) -> Result<Value, ExecutionError> {
    if let Value::Opaque(q) = &this
        && let Some(q) = q.as_ref().downcast_ref::<CelQuantity>()
    {
        return q
            .0
            .as_integer()
            .map(Value::Int)
            .ok_or_else(|| ftx.error(format!("quantity {} is not an integer that fits int", q.0)));
    }
    Err(ftx.error(format!("needs a quantity, got {this:?}")))
}

/// Splits a `QualifiedName` into (domain, name); an unqualified name is the driver's.
fn split_name<'a>(driver: &'a str, qualified: &'a str) -> (&'a str, &'a str) {
    qualified.rsplit_once('/').unwrap_or((driver, qualified))
}

fn attribute_value(attribute: &DeviceAttribute) -> Value {
    if let Some(text) = &attribute.string {
        Value::String(Arc::new(text.clone()))
    } else if let Some(number) = attribute.int {
        Value::Int(number)
    } else if let Some(flag) = attribute.bool {
        Value::Bool(flag)
    } else if let Some(version) = &attribute.version {
        // The API server validates version attributes as semver 2.0.0; a stored one that
        // does not parse is kept as text so that selectors on other attributes still work.
        match semver::Version::parse(version) {
            Ok(parsed) => Value::Opaque(Arc::new(CelSemver(parsed))),
            Err(_) => Value::String(Arc::new(version.clone())),
        }
    } else {
        Value::Null
    }
}

fn device_value(driver: &str, device: &Device) -> Value {
    let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
    // The driver's own domain is always present, so `device.attributes["<driver>"]` never
    // fails just because the device has no attributes.
    attributes.entry(driver.to_owned()).or_default();
    for (qualified, attribute) in device.attributes.iter().flatten() {
        let (domain, name) = split_name(driver, qualified);
        attributes
            .entry(domain.to_owned())
            .or_default()
            .insert(name.to_owned(), attribute_value(attribute));
    }
    let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
    capacity.entry(driver.to_owned()).or_default();
    for (qualified, entry) in device.capacity.iter().flatten() {
        let (domain, name) = split_name(driver, qualified);
        // An unparsable capacity cannot come from the API server (it validates quantities).
        let value = Quantity::parse(&entry.value.0)
            .map_or(Value::Null, |q| Value::Opaque(Arc::new(CelQuantity(q))));
        capacity.entry(domain.to_owned()).or_default().insert(name.to_owned(), value);
    }
    let nest = |groups: HashMap<String, HashMap<String, Value>>| -> Value {
        groups
            .into_iter()
            .map(|(domain, names)| (domain, Value::from(names)))
            .collect::<HashMap<String, Value>>()
            .into()
    };
    let fields: HashMap<String, Value> = HashMap::from([
        ("driver".to_owned(), Value::String(Arc::new(driver.to_owned()))),
        ("attributes".to_owned(), nest(attributes)),
        ("capacity".to_owned(), nest(capacity)),
        (
            "allowMultipleAllocations".to_owned(),
            Value::Bool(device.allow_multiple_allocations.unwrap_or(false)),
        ),
    ]);
    fields.into()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::resource::v1::DeviceCapacity;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    use super::*;

    fn device() -> Device {
        let attr = |a: DeviceAttribute| a;
        Device {
            name: "eth1".to_owned(),
            attributes: Some(BTreeMap::from([
                (
                    "netclaim.dev/ifName".to_owned(),
                    attr(DeviceAttribute { string: Some("eth1".into()), ..Default::default() }),
                ),
                ("mtu".to_owned(), DeviceAttribute { int: Some(9000), ..Default::default() }),
                (
                    "netclaim.dev/sriov".to_owned(),
                    DeviceAttribute { bool: Some(false), ..Default::default() },
                ),
                (
                    "firmware.example.com/version".to_owned(),
                    DeviceAttribute { version: Some("1.10.2".into()), ..Default::default() },
                ),
                (
                    "resource.kubernetes.io/pcieRoot".to_owned(),
                    DeviceAttribute { string: Some("pci0000:00".into()), ..Default::default() },
                ),
            ])),
            capacity: Some(BTreeMap::from([
                (
                    "netclaim.dev/interfaces".to_owned(),
                    DeviceCapacity { value: ApiQuantity("256".into()), request_policy: None },
                ),
                (
                    "memory".to_owned(),
                    DeviceCapacity { value: ApiQuantity("2Gi".into()), request_policy: None },
                ),
            ])),
            allow_multiple_allocations: Some(true),
            ..Default::default()
        }
    }

    fn eval(expression: &str) -> Result<bool, SelectorError> {
        Selector::compile(expression)?.matches("netclaim.dev", &device())
    }

    #[test]
    fn attributes_are_grouped_by_domain_and_unqualified_names_are_the_drivers() {
        assert_eq!(eval(r#"device.attributes["netclaim.dev"].ifName == "eth1""#), Ok(true));
        assert_eq!(eval(r#"device.attributes["netclaim.dev"].mtu >= 1500"#), Ok(true));
        assert_eq!(eval(r#"device.attributes["netclaim.dev"].sriov"#), Ok(false));
        assert_eq!(
            eval(r#"device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci")"#),
            Ok(true)
        );
        assert_eq!(eval(r#"device.attributes["netclaim.dev"].ifName == "eth2""#), Ok(false));
        assert_eq!(eval(r#"has(device.attributes["netclaim.dev"].vfIndex)"#), Ok(false));
    }

    #[test]
    fn driver_and_multiple_allocations() {
        assert_eq!(eval(r#"device.driver == "netclaim.dev""#), Ok(true));
        assert_eq!(eval(r#"device.driver == "gpu.example.com""#), Ok(false));
        assert_eq!(eval("device.allowMultipleAllocations"), Ok(true));
    }

    #[test]
    fn capacity_is_a_quantity() {
        assert_eq!(
            eval(r#"device.capacity["netclaim.dev"].memory.compareTo(quantity("1Gi")) > 0"#),
            Ok(true)
        );
        assert_eq!(
            eval(r#"device.capacity["netclaim.dev"].memory.isGreaterThan(quantity("2049Mi"))"#),
            Ok(false)
        );
        assert_eq!(
            eval(r#"device.capacity["netclaim.dev"].memory == quantity("2048Mi")"#),
            Ok(true)
        );
        assert_eq!(
            eval(r#"device.capacity["netclaim.dev"].interfaces.isLessThan(quantity("1k"))"#),
            Ok(true)
        );
        assert_eq!(
            eval(r#"device.capacity["netclaim.dev"].interfaces.asInteger() == 256"#),
            Ok(true)
        );
    }

    #[test]
    fn versions_compare_as_semver() {
        assert_eq!(
            eval(
                r#"device.attributes["firmware.example.com"].version.isGreaterThan(semver("1.9.0"))"#
            ),
            Ok(true)
        );
        assert_eq!(
            eval(
                r#"device.attributes["firmware.example.com"].version.compareTo(semver("1.10.2")) == 0"#
            ),
            Ok(true)
        );
        assert_eq!(eval(r#"semver("2.0.0").isLessThan(semver("10.0.0"))"#), Ok(true));
    }

    #[test]
    fn errors_name_the_expression() {
        let missing = eval(r#"device.attributes["netclaim.dev"].nope == 1"#).unwrap_err();
        assert!(
            matches!(missing, SelectorError::Eval { ref expression, .. } if expression.contains("nope")),
            "{missing}"
        );
        assert!(matches!(eval("device.driver"), Err(SelectorError::NotBool { .. })));
        assert!(matches!(eval("device.driver =="), Err(SelectorError::Compile { .. })));
        let bad = eval(r#"quantity("lots").isLessThan(quantity("1"))"#).unwrap_err();
        assert!(bad.to_string().contains("lots"), "{bad}");
        assert!(eval(r#"quantity("1").isLessThan(semver("1.0.0"))"#).is_err());
    }
}
