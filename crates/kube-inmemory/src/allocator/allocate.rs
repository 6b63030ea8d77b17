//! Pure allocation: complete pools + device classes + existing allocations + one claim →
//! the claim's `status.allocation`, or an error naming the request and why nothing fits.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequestPolicy, Device, DeviceAllocationConfiguration,
    DeviceAllocationResult, DeviceClaim, DeviceClass, DeviceRequest, DeviceRequestAllocationResult,
    DeviceSelector, ResourceClaim, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::quantity::{Quantity, QuantityError};
use super::selector::{Selector, SelectorError};

/// Why a claim could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// The claim is malformed or uses something this allocator does not do.
    #[error("claim field {field}: {message}")]
    InvalidClaim {
        /// The field path.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A request names a DeviceClass that does not exist.
    #[error("request {request:?}: DeviceClass {class:?} not found")]
    UnknownClass {
        /// The request (`<main>/<sub>` for a subrequest).
        request: String,
        /// The class name.
        class: String,
    },
    /// A class or request selector does not compile or fails to evaluate.
    #[error("request {request:?}, {origin}: {source}")]
    Selector {
        /// The request.
        request: String,
        /// `DeviceClass "x"` or `request selector`.
        origin: String,
        /// The CEL error (names the expression).
        #[source]
        source: Box<SelectorError>,
    },
    /// A capacity amount in the claim is not a quantity.
    #[error("request {request:?}: capacity {name:?}: {source}")]
    BadQuantity {
        /// The request.
        request: String,
        /// The capacity name.
        name: String,
        /// The parse error.
        #[source]
        source: QuantityError,
    },
    /// No combination of devices satisfies the claim.
    #[error("request {request:?} cannot be satisfied: {reason}")]
    NoFit {
        /// The request that could not be satisfied (the deepest one the search reached).
        request: String,
        /// Why, per alternative: how many devices matched and why each matching one was
        /// unavailable.
        reason: String,
    },
}

/// A device in a complete pool visible to the node.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Driver that published it.
    pub driver: &'a str,
    /// Pool name.
    pub pool: &'a str,
    /// The device.
    pub device: &'a Device,
    /// Published for one node (`spec.nodeName`), not `allNodes`.
    pub node_local: bool,
}

/// `(driver, pool, device)`.
type DeviceKey = (String, String, String);

fn key(candidate: &Candidate<'_>) -> DeviceKey {
    (candidate.driver.to_owned(), candidate.pool.to_owned(), candidate.device.name.clone())
}

/// Devices of complete pools usable on `node`: per (driver, pool) only the highest
/// generation, and only when all `resourceSliceCount` slices of it are present (a pool being
/// rewritten is skipped until it is whole again).
#[must_use]
pub fn complete_pools<'a>(slices: &'a [ResourceSlice], node: &str) -> Vec<Candidate<'a>> {
    let visible: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node) || s.spec.all_nodes == Some(true))
        .collect();
    let mut newest: HashMap<(&str, &str), (i64, i64, usize)> = HashMap::new();
    for slice in &visible {
        let pool = &slice.spec.pool;
        let entry = newest.entry((slice.spec.driver.as_str(), pool.name.as_str())).or_insert((
            pool.generation,
            pool.resource_slice_count,
            0,
        ));
        if pool.generation > entry.0 {
            *entry = (pool.generation, pool.resource_slice_count, 0);
        }
        if pool.generation == entry.0 {
            entry.2 += 1;
        }
    }
    let mut out: Vec<Candidate<'a>> = visible
        .into_iter()
        .filter(|slice| {
            let pool = &slice.spec.pool;
            newest.get(&(slice.spec.driver.as_str(), pool.name.as_str())).is_some_and(
                |&(generation, count, seen)| {
                    pool.generation == generation && i64::try_from(seen).is_ok_and(|s| s == count)
                },
            )
        })
        .flat_map(|slice| {
            slice.spec.devices.iter().flatten().map(move |device| Candidate {
                driver: &slice.spec.driver,
                pool: &slice.spec.pool.name,
                device,
                node_local: slice.spec.node_name.is_some(),
            })
        })
        .collect();
    out.sort_by(|a, b| (a.driver, a.pool, &a.device.name).cmp(&(b.driver, b.pool, &b.device.name)));
    out
}

/// What existing allocations hold: exclusively used devices and consumed capacity.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    exclusive: HashSet<DeviceKey>,
    consumed: HashMap<DeviceKey, BTreeMap<String, Quantity>>,
}

impl Usage {
    /// Accounts every allocated claim in `claims` except `skip_uid` (the claim being
    /// allocated). A result with a `shareID` or `consumedCapacity` is a share of a
    /// multi-allocatable device; any other result holds its device exclusively.
    #[must_use]
    pub fn from_claims<'a>(
        claims: impl IntoIterator<Item = &'a ResourceClaim>,
        skip_uid: Option<&str>,
    ) -> Self {
        let mut usage = Self::default();
        for claim in claims {
            if skip_uid.is_some() && claim.metadata.uid.as_deref() == skip_uid {
                continue;
            }
            usage.add_claim(claim);
        }
        usage
    }

    /// Accounts the allocation of `claim` (nothing when it has none), as [`Self::from_claims`]
    /// does for each claim: a pass allocating many claims keeps one `Usage` and adds each
    /// allocation it writes, instead of rebuilding it from every claim for each one.
    pub fn add_claim(&mut self, claim: &ResourceClaim) {
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for result in results.into_iter().flatten() {
            let k = (result.driver.clone(), result.pool.clone(), result.device.clone());
            if result.share_id.is_none() && result.consumed_capacity.is_none() {
                self.exclusive.insert(k);
                continue;
            }
            let slot = self.consumed.entry(k).or_default();
            for (name, amount) in result.consumed_capacity.iter().flatten() {
                // Amounts we did not write ourselves could be malformed; an unparsable
                // one counts as nothing rather than blocking the device for ever.
                let amount = Quantity::parse(&amount.0).unwrap_or(Quantity::ZERO);
                let total = slot.entry(name.clone()).or_insert(Quantity::ZERO);
                *total = total.saturating_add(amount);
            }
        }
    }

    fn release(&mut self, pick: &Pick) {
        match &pick.consumed {
            None => {
                self.exclusive.remove(&pick.key);
            }
            Some(consumed) => {
                if let Some(slot) = self.consumed.get_mut(&pick.key) {
                    for (name, amount) in consumed {
                        if let Some(total) = slot.get_mut(name) {
                            *total = Quantity::from_nanos(total.nanos() - amount.nanos());
                        }
                    }
                }
            }
        }
    }
}

/// Fully qualified capacity name (an unqualified one is in the driver's domain).
fn qualify(driver: &str, name: &str) -> String {
    if name.contains('/') { name.to_owned() } else { format!("{driver}/{name}") }
}

/// Rounds a requested amount per the capacity's request policy (KEP-5075): `validValues`
/// round up to the next listed value, `validRange` up to `min + n·step` within `max`.
fn apply_policy(requested: Quantity, policy: &CapacityRequestPolicy) -> Result<Quantity, String> {
    let parse = |q: &ApiQuantity| Quantity::parse(&q.0).map_err(|e| e.to_string());
    if let Some(values) = &policy.valid_values {
        let mut parsed = values.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
        parsed.sort();
        return parsed.into_iter().find(|v| *v >= requested).ok_or_else(|| {
            format!(
                "{requested} is above every valid value {:?}",
                values.iter().map(|v| &v.0).collect::<Vec<_>>()
            )
        });
    }
    if let Some(range) = &policy.valid_range {
        let min = parse(&range.min)?;
        let mut amount = requested.max(min);
        if let Some(step) = range.step.as_ref().map(parse).transpose()?
            && step.nanos() > 0
        {
            let over = amount.nanos() - min.nanos();
            let steps = (over + step.nanos() - 1) / step.nanos();
            amount = Quantity::from_nanos(min.nanos() + steps * step.nanos());
        }
        if let Some(max) = range.max.as_ref().map(parse).transpose()?
            && amount > max
        {
            return Err(format!("{amount} is above the valid range's max {max}"));
        }
        return Ok(amount);
    }
    Ok(requested)
}

/// One tentatively allocated device.
#[derive(Debug, Clone)]
struct Pick {
    request: String,
    key: DeviceKey,
    share_id: Option<String>,
    /// `Some` for a share of a multi-allocatable device.
    consumed: Option<BTreeMap<String, Quantity>>,
}

/// One way of satisfying a request: an `exactly` request or one `firstAvailable` entry.
#[derive(Debug)]
struct Alternative {
    /// Result `request` name (`<main>` or `<main>/<sub>`).
    name: String,
    class: String,
    /// `None` = allocation mode `All`.
    count: Option<usize>,
    capacity: BTreeMap<String, Quantity>,
    /// Indices into the candidates, in order, that pass class and request selectors.
    matching: Vec<usize>,
}

struct Search<'a, 'c> {
    candidates: &'c [Candidate<'a>],
    requests: Vec<(String, Vec<Alternative>)>,
    usage: Usage,
    picks: Vec<Pick>,
    /// Deepest failure seen: (request index, message).
    failure: Option<(usize, String)>,
    new_share_id: &'c mut dyn FnMut() -> String,
}

impl Search<'_, '_> {
    /// Takes `candidate` for `alt`, or says why not.
    fn take(&mut self, alt: &Alternative, index: usize) -> Result<Pick, String> {
        let candidate = &self.candidates[index];
        let device = candidate.device;
        let k = key(candidate);
        if self.picks.iter().any(|p| p.key == k && p.request == alt.name) {
            return Err("already picked for this request".to_owned());
        }
        let capacities: BTreeMap<String, _> = device
            .capacity
            .iter()
            .flatten()
            .map(|(name, cap)| (qualify(candidate.driver, name), cap))
            .collect();
        for name in alt.capacity.keys() {
            if !capacities.contains_key(&qualify(candidate.driver, name)) {
                return Err(format!("has no capacity {name}"));
            }
        }
        let requested = |name: &str| {
            alt.capacity.iter().find(|(n, _)| qualify(candidate.driver, n) == name).map(|(_, q)| *q)
        };
        if device.allow_multiple_allocations != Some(true) {
            if self.usage.exclusive.contains(&k) {
                return Err("allocated to another claim".to_owned());
            }
            for (name, cap) in &capacities {
                let value = Quantity::parse(&cap.value.0).map_err(|e| e.to_string())?;
                if let Some(amount) = requested(name)
                    && amount > value
                {
                    return Err(format!("capacity {name} is {value}, {amount} requested"));
                }
            }
            self.usage.exclusive.insert(k.clone());
            return Ok(Pick { request: alt.name.clone(), key: k, share_id: None, consumed: None });
        }
        if self.usage.exclusive.contains(&k) {
            return Err("allocated exclusively to another claim".to_owned());
        }
        let mut consumed = BTreeMap::new();
        let used = self.usage.consumed.get(&k);
        for (name, cap) in &capacities {
            let value =
                Quantity::parse(&cap.value.0).map_err(|e| format!("capacity {name}: {e}"))?;
            let amount = match (requested(name), &cap.request_policy) {
                (Some(amount), Some(policy)) => apply_policy(amount, policy),
                (None, Some(policy)) => match &policy.default {
                    Some(default) => Quantity::parse(&default.0)
                        .map_err(|e| e.to_string())
                        .and_then(|d| apply_policy(d, policy)),
                    // KEP-5075: without a default the whole capacity is consumed.
                    None => Ok(value),
                },
                (Some(amount), None) => Ok(amount),
                (None, None) => Ok(value),
            }
            .map_err(|e| format!("capacity {name}: {e}"))?;
            let already = used.and_then(|u| u.get(name)).copied().unwrap_or(Quantity::ZERO);
            if already.saturating_add(amount) > value {
                return Err(format!(
                    "capacity {name}: {already} of {value} already consumed, {amount} more requested"
                ));
            }
            consumed.insert(name.clone(), amount);
        }
        let slot = self.usage.consumed.entry(k.clone()).or_default();
        for (name, amount) in &consumed {
            let total = slot.entry(name.clone()).or_insert(Quantity::ZERO);
            *total = total.saturating_add(*amount);
        }
        Ok(Pick {
            request: alt.name.clone(),
            key: k,
            share_id: Some((self.new_share_id)()),
            consumed: Some(consumed),
        })
    }

    fn fail(&mut self, request: usize, message: String) {
        if self.failure.as_ref().is_none_or(|(deepest, _)| request >= *deepest) {
            self.failure = Some((request, message));
        }
    }

    fn solve(&mut self, request: usize) -> bool {
        if request == self.requests.len() {
            return true;
        }
        let alternatives = std::mem::take(&mut self.requests[request].1);
        let mut reasons = Vec::new();
        let mut solved = false;
        for alt in &alternatives {
            let mark = self.picks.len();
            let ok = match alt.count {
                Some(count) => self.pick_n(request, alt, 0, count, &mut reasons),
                None => self.pick_all(request, alt, &mut reasons),
            };
            if ok {
                solved = true;
                break;
            }
            debug_assert_eq!(self.picks.len(), mark, "a failed branch leaves no picks");
        }
        self.requests[request].1 = alternatives;
        if !solved && !reasons.is_empty() {
            self.fail(request, reasons.join("; "));
        }
        solved
    }

    fn undo(&mut self) {
        if let Some(pick) = self.picks.pop() {
            self.usage.release(&pick);
        }
    }

    fn pick_n(
        &mut self,
        request: usize,
        alt: &Alternative,
        from: usize,
        remaining: usize,
        reasons: &mut Vec<String>,
    ) -> bool {
        if remaining == 0 {
            return self.solve(request + 1);
        }
        let mut unavailable = Vec::new();
        for position in from..alt.matching.len() {
            let index = alt.matching[position];
            match self.take(alt, index) {
                Ok(pick) => {
                    self.picks.push(pick);
                    if self.pick_n(request, alt, position + 1, remaining - 1, reasons) {
                        return true;
                    }
                    self.undo();
                }
                Err(why) => {
                    unavailable.push(format!("{}: {why}", self.candidates[index].device.name));
                }
            }
        }
        if from == 0 {
            reasons.push(describe(alt, remaining, &unavailable));
        }
        false
    }

    fn pick_all(&mut self, request: usize, alt: &Alternative, reasons: &mut Vec<String>) -> bool {
        if alt.matching.is_empty() {
            reasons.push(describe(alt, 1, &[]));
            return false;
        }
        let mark = self.picks.len();
        for &index in &alt.matching {
            match self.take(alt, index) {
                Ok(pick) => self.picks.push(pick),
                Err(why) => {
                    while self.picks.len() > mark {
                        self.undo();
                    }
                    let why = format!("{}: {why}", self.candidates[index].device.name);
                    reasons.push(format!(
                        "{} (allocationMode All needs every matching device)",
                        describe(alt, alt.matching.len(), &[why])
                    ));
                    return false;
                }
            }
        }
        if self.solve(request + 1) {
            return true;
        }
        while self.picks.len() > mark {
            self.undo();
        }
        false
    }
}

fn describe(alt: &Alternative, wanted: usize, unavailable: &[String]) -> String {
    let mut text = format!(
        "{}: class {:?} and selectors match {} device(s), {wanted} needed",
        alt.name,
        alt.class,
        alt.matching.len()
    );
    if !unavailable.is_empty() {
        text.push_str(", unavailable: ");
        text.push_str(&unavailable.join(", "));
    }
    text
}

/// Everything one allocation looks at.
#[derive(Debug, Clone, Copy)]
pub struct AllocationInput<'a> {
    /// The node the dev cluster runs (allocations are for it).
    pub node: &'a str,
    /// All ResourceSlices.
    pub slices: &'a [ResourceSlice],
    /// All DeviceClasses.
    pub classes: &'a [DeviceClass],
    /// All claims (allocated ones account used devices and capacity).
    pub claims: &'a [ResourceClaim],
}

fn compile(
    request: &str,
    origin: &str,
    selectors: Option<&Vec<DeviceSelector>>,
) -> Result<Vec<Selector>, AllocationError> {
    selectors
        .into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref())
        .map(|cel| {
            Selector::compile(&cel.expression).map_err(|source| AllocationError::Selector {
                request: request.to_owned(),
                origin: origin.to_owned(),
                source: Box::new(source),
            })
        })
        .collect()
}

/// Parameters shared by `exactly` and `firstAvailable` entries.
struct RequestShape<'r> {
    name: String,
    field: String,
    class: &'r str,
    selectors: Option<&'r Vec<DeviceSelector>>,
    mode: Option<&'r str>,
    count: Option<i64>,
    capacity: Option<&'r BTreeMap<String, ApiQuantity>>,
}

fn alternative(
    shape: &RequestShape<'_>,
    input: &AllocationInput<'_>,
    candidates: &[Candidate<'_>],
) -> Result<Alternative, AllocationError> {
    let class =
        input.classes.iter().find(|c| c.metadata.name.as_deref() == Some(shape.class)).ok_or_else(
            || AllocationError::UnknownClass {
                request: shape.name.clone(),
                class: shape.class.to_owned(),
            },
        )?;
    let class_selectors = compile(
        &shape.name,
        &format!("DeviceClass {:?}", shape.class),
        class.spec.as_ref().and_then(|spec| spec.selectors.as_ref()),
    )?;
    let request_selectors = compile(&shape.name, "request selector", shape.selectors)?;
    let count = match shape.mode.unwrap_or("ExactCount") {
        "ExactCount" => {
            let count = shape.count.unwrap_or(1);
            Some(usize::try_from(count).ok().filter(|c| *c > 0).ok_or_else(|| {
                AllocationError::InvalidClaim {
                    field: format!("{}.count", shape.field),
                    message: format!("must be > 0, got {count}"),
                }
            })?)
        }
        "All" => None,
        other => {
            return Err(AllocationError::InvalidClaim {
                field: format!("{}.allocationMode", shape.field),
                message: format!("{other:?} is neither ExactCount nor All"),
            });
        }
    };
    let mut capacity = BTreeMap::new();
    for (name, amount) in shape.capacity.into_iter().flatten() {
        let parsed = Quantity::parse(&amount.0).map_err(|source| AllocationError::BadQuantity {
            request: shape.name.clone(),
            name: name.clone(),
            source,
        })?;
        capacity.insert(name.clone(), parsed);
    }
    let mut matching = Vec::new();
    for (index, candidate) in candidates.iter().enumerate() {
        let mut matched = true;
        for (selector, origin) in class_selectors
            .iter()
            .map(|s| (s, format!("DeviceClass {:?}", shape.class)))
            .chain(request_selectors.iter().map(|s| (s, "request selector".to_owned())))
        {
            let hit = selector.matches(candidate.driver, candidate.device).map_err(|source| {
                AllocationError::Selector {
                    request: shape.name.clone(),
                    origin,
                    source: Box::new(source),
                }
            })?;
            if !hit {
                matched = false;
                break;
            }
        }
        if matched {
            matching.push(index);
        }
    }
    Ok(Alternative {
        name: shape.name.clone(),
        class: shape.class.to_owned(),
        count,
        capacity,
        matching,
    })
}

/// The alternatives of request `index`: one for `exactly`, one per `firstAvailable` entry.
fn request_alternatives(
    index: usize,
    request: &DeviceRequest,
    input: &AllocationInput<'_>,
    candidates: &[Candidate<'_>],
) -> Result<Vec<Alternative>, AllocationError> {
    let field = format!("spec.devices.requests[{index}]");
    match (&request.exactly, &request.first_available) {
        (Some(exact), None) => Ok(vec![alternative(
            &RequestShape {
                name: request.name.clone(),
                field: format!("{field}.exactly"),
                class: &exact.device_class_name,
                selectors: exact.selectors.as_ref(),
                mode: exact.allocation_mode.as_deref(),
                count: exact.count,
                capacity: exact.capacity.as_ref().and_then(|c| c.requests.as_ref()),
            },
            input,
            candidates,
        )?]),
        (None, Some(subs)) if !subs.is_empty() => subs
            .iter()
            .enumerate()
            .map(|(j, sub)| {
                alternative(
                    &RequestShape {
                        name: format!("{}/{}", request.name, sub.name),
                        field: format!("{field}.firstAvailable[{j}]"),
                        class: &sub.device_class_name,
                        selectors: sub.selectors.as_ref(),
                        mode: sub.allocation_mode.as_deref(),
                        count: sub.count,
                        capacity: sub.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                    },
                    input,
                    candidates,
                )
            })
            .collect(),
        _ => Err(AllocationError::InvalidClaim {
            field,
            message: "exactly one of exactly and firstAvailable (non-empty) must be set".to_owned(),
        }),
    }
}

/// Class entries first (each restricted to the request that used the class), then the
/// claim's own entries (DESIGN §3).
fn allocation_config(
    requests: &[(String, Vec<Alternative>)],
    picks: &[Pick],
    classes: &[DeviceClass],
    devices: &DeviceClaim,
) -> Vec<DeviceAllocationConfiguration> {
    let mut config = Vec::new();
    for (_, alternatives) in requests {
        for alt in alternatives {
            if !picks.iter().any(|p| p.request == alt.name) {
                continue;
            }
            let class =
                classes.iter().find(|c| c.metadata.name.as_deref() == Some(alt.class.as_str()));
            for entry in class.and_then(|c| c.spec.as_ref()?.config.as_ref()).into_iter().flatten()
            {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".to_owned(),
                    requests: Some(vec![alt.name.clone()]),
                    opaque: entry.opaque.clone(),
                });
            }
        }
    }
    for entry in devices.config.iter().flatten() {
        config.push(DeviceAllocationConfiguration {
            source: "FromClaim".to_owned(),
            requests: entry.requests.clone(),
            opaque: entry.opaque.clone(),
        });
    }
    config
}

/// Computes `status.allocation` for `claim`. `new_share_id` mints the `shareID` of each
/// share of a multi-allocatable device (a fresh UUID in production).
pub fn allocate(
    input: &AllocationInput<'_>,
    claim: &ResourceClaim,
    new_share_id: &mut dyn FnMut() -> String,
) -> Result<AllocationResult, AllocationError> {
    let usage = Usage::from_claims(input.claims, claim.metadata.uid.as_deref());
    allocate_with_usage(input, claim, usage, new_share_id)
}

/// [`allocate`] against `usage` (what every other claim holds, `claim` itself left out)
/// instead of one rebuilt from `input.claims`: the allocator's passes keep one `Usage` and
/// add each allocation they make ([`Usage::add_claim`]), so a pass over N claims costs N
/// searches, not N scans of every claim (which made a 1,000-pod burst quadratic).
pub fn allocate_with_usage(
    input: &AllocationInput<'_>,
    claim: &ResourceClaim,
    usage: Usage,
    new_share_id: &mut dyn FnMut() -> String,
) -> Result<AllocationResult, AllocationError> {
    let devices = claim.spec.as_ref().and_then(|spec| spec.devices.as_ref());
    let Some(devices) = devices else {
        return Ok(AllocationResult::default());
    };
    if devices.constraints.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(AllocationError::InvalidClaim {
            field: "spec.devices.constraints".to_owned(),
            message: "constraints (matchAttribute, distinctAttribute) are not supported by the dev allocator".to_owned(),
        });
    }
    let candidates = complete_pools(input.slices, input.node);
    let mut requests = Vec::new();
    for (index, request) in devices.requests.iter().flatten().enumerate() {
        let alternatives = request_alternatives(index, request, input, &candidates)?;
        requests.push((request.name.clone(), alternatives));
    }
    let mut search = Search {
        candidates: &candidates,
        requests,
        usage,
        picks: Vec::new(),
        failure: None,
        new_share_id,
    };
    if !search.solve(0) {
        let (index, reason) = search.failure.take().unwrap_or((0, "no devices".to_owned()));
        let request = search.requests.get(index).map(|r| r.0.clone()).unwrap_or_default();
        return Err(AllocationError::NoFit { request, reason });
    }
    let config = allocation_config(&search.requests, &search.picks, input.classes, devices);
    let node_local =
        search.picks.iter().any(|p| candidates.iter().any(|c| key(c) == p.key && c.node_local));
    let results = search
        .picks
        .into_iter()
        .map(|pick| DeviceRequestAllocationResult {
            request: pick.request,
            driver: pick.key.0,
            pool: pick.key.1,
            device: pick.key.2,
            share_id: pick.share_id,
            consumed_capacity: pick
                .consumed
                .map(|c| c.into_iter().map(|(n, q)| (n, ApiQuantity(q.to_string()))).collect()),
            ..DeviceRequestAllocationResult::default()
        })
        .collect();
    Ok(AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(results),
            config: if config.is_empty() { None } else { Some(config) },
        }),
        node_selector: node_local.then(|| node_selector(input.node)),
        ..AllocationResult::default()
    })
}

/// `matchFields metadata.name In [node]`: the allocation is usable on this node only.
#[must_use]
pub fn node_selector(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_owned(),
                operator: "In".to_owned(),
                values: Some(vec![node.to_owned()]),
            }]),
            ..NodeSelectorTerm::default()
        }],
    }
}
