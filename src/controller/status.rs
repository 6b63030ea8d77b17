//! What a `PodNetwork`'s status should say (pure): the verdict on its spec among the other
//! networks (Invalid, Overlaps, Disabled, Ready), the `Ready` condition with
//! `observedGeneration` (`Deleting` while a deleted network waits for its IPBlocks), and
//! whether that is a change worth a write.

use std::cmp::Ordering;

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::model::pod_network::validate::{self, FieldError};
use crate::model::pod_network::{CONDITION_READY, PodNetwork, PodNetworkStatus, reason};

/// The controller's judgement of one network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Valid, enabled, no overlap with an older network.
    Ready,
    /// `spec.enabled: false` (valid, no overlap).
    Disabled,
    /// A field is invalid.
    Invalid(FieldError),
    /// A subnet overlaps one of an older network.
    Overlaps {
        /// The older network.
        other: String,
        /// Our subnet.
        mine: IpNetwork,
        /// Its subnet.
        theirs: IpNetwork,
    },
}

impl Verdict {
    /// The condition reason.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Verdict::Ready => reason::READY,
            Verdict::Disabled => reason::DISABLED,
            Verdict::Invalid(_) => reason::INVALID,
            Verdict::Overlaps { .. } => reason::OVERLAPS,
        }
    }

    /// Whether the network's DeviceClass should exist and follow the spec: a network that is
    /// only disabled keeps serving its running pods' claims (and a re-enable needs no
    /// re-creation); an invalid or overlapping one leaves the class as it was.
    #[must_use]
    pub fn manages_device_class(&self) -> bool {
        matches!(self, Verdict::Ready | Verdict::Disabled)
    }

    /// The condition message.
    #[must_use]
    pub fn message(&self) -> String {
        match self {
            Verdict::Ready => "the network is valid and enabled".to_owned(),
            Verdict::Disabled => "spec.enabled is false: devices lose the podNetwork attribute \
                                  (no new claims); running pods keep their interfaces"
                .to_owned(),
            Verdict::Invalid(err) => err.to_string(),
            Verdict::Overlaps { other, mine, theirs } => format!(
                "spec.ipam.subnets: {mine} overlaps {theirs} of PodNetwork {other:?}, which is \
                 older and keeps it"
            ),
        }
    }
}

/// The age order of networks: creation time, then name (creation times have one-second
/// resolution). A network without a creation time counts as the newest.
fn age_key(network: &PodNetwork) -> (bool, Option<Timestamp>, &str) {
    let created = network.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (created.is_none(), created, network.metadata.name.as_deref().unwrap_or_default())
}

/// Whether `a` is older than `b` (ties broken by name, so exactly one of two is older).
#[must_use]
pub fn is_older(a: &PodNetwork, b: &PodNetwork) -> bool {
    age_key(a).cmp(&age_key(b)) == Ordering::Less
}

/// Judges `network` among `all` (every PodNetwork the controller sees, `network` included
/// or not). Overlaps count only against networks that are valid, not being deleted and
/// older: of two overlapping networks the older keeps Ready and the newer gets Overlaps,
/// whatever order they are reconciled in. A disabled network still holds its addresses, so it
/// counts.
#[must_use]
pub fn verdict<'a>(network: &PodNetwork, all: impl IntoIterator<Item = &'a PodNetwork>) -> Verdict {
    let mine = match validate::validate(&network.spec) {
        Ok(valid) => valid,
        Err(err) => return Verdict::Invalid(err),
    };
    let name = network.metadata.name.as_deref().unwrap_or_default();
    let mut found: Option<(&PodNetwork, IpNetwork, IpNetwork)> = None;
    for other in all {
        let other_name = other.metadata.name.as_deref().unwrap_or_default();
        if other_name == name
            || other.metadata.deletion_timestamp.is_some()
            || !is_older(other, network)
        {
            continue;
        }
        let Ok(theirs) = validate::validate(&other.spec) else { continue };
        if let Some((a, b)) = validate::overlap(&mine.subnets, &theirs.subnets) {
            // Name the oldest of the networks it overlaps: the one that will keep its range
            // the longest.
            if found.as_ref().is_none_or(|(prev, _, _)| is_older(other, prev)) {
                found = Some((other, a, b));
            }
        }
    }
    if let Some((other, mine, theirs)) = found {
        return Verdict::Overlaps {
            other: other.metadata.name.clone().unwrap_or_default(),
            mine,
            theirs,
        };
    }
    if network.spec.enabled { Verdict::Ready } else { Verdict::Disabled }
}

/// The status the network should have: the `Ready` condition for `verdict` at the object's
/// generation (keeping `lastTransitionTime` while the condition's status stays the same, as
/// `meta.SetStatusCondition` does), conditions of other types as they are, and the
/// DeviceClass name when the class exists.
#[must_use]
pub fn desired_status(
    network: &PodNetwork,
    verdict: &Verdict,
    device_class: Option<String>,
    now: Timestamp,
) -> PodNetworkStatus {
    let generation = network.metadata.generation;
    let current = network.status.clone().unwrap_or_default();
    let previous = current.conditions.iter().find(|c| c.type_ == CONDITION_READY);
    let status = if matches!(verdict, Verdict::Ready) { "True" } else { "False" };
    let last_transition_time = match previous {
        Some(previous) if previous.status == status => previous.last_transition_time.clone(),
        _ => Time(now),
    };
    let ready = Condition {
        type_: CONDITION_READY.to_owned(),
        status: status.to_owned(),
        reason: verdict.reason().to_owned(),
        message: verdict.message(),
        observed_generation: generation,
        last_transition_time,
    };
    let mut conditions: Vec<Condition> =
        current.conditions.iter().filter(|c| c.type_ != CONDITION_READY).cloned().collect();
    conditions.insert(0, ready);
    PodNetworkStatus {
        observed_generation: generation,
        conditions,
        device_class_name: device_class,
        // The sweep's count: kept as it is.
        nodes: current.nodes,
    }
}

/// How many IPBlocks a `Deleting` message names before "and N more".
const LISTED_BLOCKS: usize = 5;

/// The status of a network being deleted whose finalizer waits for `blocks` (`(name,
/// node)`): `Ready=False`, reason `Deleting`, a message naming the blocks and their nodes;
/// the DeviceClass is gone; other conditions and the node count stay. `lastTransitionTime`
/// moves only when `Ready` was True.
#[must_use]
pub fn deleting_status(
    network: &PodNetwork,
    blocks: &[(String, String)],
    now: Timestamp,
) -> PodNetworkStatus {
    let mut listed: Vec<String> = blocks
        .iter()
        .take(LISTED_BLOCKS)
        .map(|(block, node)| format!("{block} (node {node})"))
        .collect();
    if blocks.len() > LISTED_BLOCKS {
        listed.push(format!("and {} more", blocks.len() - LISTED_BLOCKS));
    }
    let message = format!(
        "being deleted: waiting for {} IPBlock(s), which their nodes release at their next \
         release pass once no pod holds an address in them: {}",
        blocks.len(),
        listed.join(", ")
    );
    let generation = network.metadata.generation;
    let current = network.status.clone().unwrap_or_default();
    let previous = current.conditions.iter().find(|c| c.type_ == CONDITION_READY);
    let last_transition_time = match previous {
        Some(previous) if previous.status == "False" => previous.last_transition_time.clone(),
        _ => Time(now),
    };
    let ready = Condition {
        type_: CONDITION_READY.to_owned(),
        status: "False".to_owned(),
        reason: reason::DELETING.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    };
    let mut conditions: Vec<Condition> =
        current.conditions.iter().filter(|c| c.type_ != CONDITION_READY).cloned().collect();
    conditions.insert(0, ready);
    PodNetworkStatus {
        observed_generation: generation,
        conditions,
        device_class_name: None,
        nodes: current.nodes,
    }
}

/// Whether writing `desired` would change what the object says.
#[must_use]
pub fn needs_write(network: &PodNetwork, desired: &PodNetworkStatus) -> bool {
    network.status.as_ref() != Some(desired)
}

/// The `Ready` reason the object carries now, if any.
#[must_use]
pub fn current_reason(network: &PodNetwork) -> Option<&str> {
    network
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_READY)
        .map(|c| c.reason.as_str())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn network(name: &str, created: i64, spec: &serde_json::Value) -> PodNetwork {
        let mut network: PodNetwork =
            serde_json::from_value(json!({"spec": spec})).expect("the test's spec decodes");
        network.metadata = ObjectMeta {
            name: Some(name.to_owned()),
            generation: Some(2),
            creation_timestamp: Some(Time(Timestamp::from_second(created).expect("a time"))),
            ..ObjectMeta::default()
        };
        network
    }

    fn subnets(list: &[&str]) -> serde_json::Value {
        json!({"parents": ["eth1"], "ipam": {"subnets": list}})
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("a time")
    }

    #[test]
    fn the_older_network_keeps_ready_and_the_newer_gets_overlaps_naming_both() {
        let old = network("old", 100, &subnets(&["10.10.0.0/16"]));
        let new = network("new", 200, &subnets(&["fd00::/64", "10.10.128.0/17"]));
        let all = [old.clone(), new.clone()];
        assert_eq!(verdict(&old, &all), Verdict::Ready);
        let got = verdict(&new, &all);
        assert_eq!(
            got,
            Verdict::Overlaps {
                other: "old".into(),
                mine: "10.10.128.0/17".parse().expect("cidr"),
                theirs: "10.10.0.0/16".parse().expect("cidr"),
            }
        );
        let message = got.message();
        assert!(
            message.contains("\"old\"")
                && message.contains("10.10.128.0/17")
                && message.contains("10.10.0.0/16"),
            "{message}"
        );
    }

    #[test]
    fn equal_creation_times_are_ordered_by_name() {
        let a = network("alpha", 100, &subnets(&["10.10.0.0/16"]));
        let b = network("beta", 100, &subnets(&["10.10.0.0/16"]));
        let all = [b.clone(), a.clone()];
        assert_eq!(verdict(&a, &all), Verdict::Ready);
        assert_eq!(verdict(&b, &all).reason(), reason::OVERLAPS);
        assert!(is_older(&a, &b) && !is_older(&b, &a) && !is_older(&a, &a));
    }

    #[test]
    fn only_valid_networks_not_being_deleted_count() {
        let new = network("new", 300, &subnets(&["10.10.0.0/16"]));
        let mut deleting = network("deleting", 100, &subnets(&["10.10.0.0/16"]));
        deleting.metadata.deletion_timestamp = Some(Time(at(250)));
        let mut invalid = network("invalid", 100, &subnets(&["10.10.0.0/16"]));
        invalid.spec.parents.clear();
        let newer = network("newer", 400, &subnets(&["10.10.0.0/16"]));
        assert_eq!(verdict(&new, &[deleting, invalid, newer]), Verdict::Ready);
        // A disabled older network still holds its range.
        let mut disabled = network("disabled", 100, &subnets(&["10.10.0.0/24"]));
        disabled.spec.enabled = false;
        assert_eq!(verdict(&new, &[disabled.clone()]).reason(), reason::OVERLAPS);
        assert_eq!(verdict(&disabled, &[new]), Verdict::Disabled);
    }

    #[test]
    fn invalid_comes_before_overlaps_and_disabled() {
        let old = network("old", 100, &subnets(&["10.10.0.0/16"]));
        let mut bad = network("bad", 200, &subnets(&["10.10.0.0/16"]));
        bad.spec.enabled = false;
        bad.spec.ipam.as_mut().expect("ipam").gateways = vec!["10.9.0.1".into()];
        let got = verdict(&bad, &[old]);
        assert_eq!(got.reason(), reason::INVALID);
        assert_eq!(got.message(), "spec.ipam.gateways[0]: 10.9.0.1 is not inside any subnet");
    }

    #[test]
    fn the_oldest_of_several_overlapping_networks_is_named() {
        let first = network("first", 100, &subnets(&["10.10.0.0/24"]));
        let second = network("second", 200, &subnets(&["10.10.1.0/24"]));
        let me = network("me", 300, &subnets(&["10.10.0.0/16"]));
        let Verdict::Overlaps { other, .. } = verdict(&me, &[second, first]) else {
            panic!("expected Overlaps")
        };
        assert_eq!(other, "first");
    }

    #[test]
    fn transitions_keep_the_time_while_the_status_stays_and_track_the_generation() {
        let mut net = network("n", 100, &subnets(&["10.10.0.0/16"]));
        // First status: Invalid.
        let invalid = Verdict::Invalid(FieldError { path: "spec.x".into(), message: "bad".into() });
        let first = desired_status(&net, &invalid, None, at(1000));
        let ready = &first.conditions[0];
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "Invalid"));
        assert_eq!(ready.last_transition_time, Time(at(1000)));
        assert_eq!((ready.observed_generation, first.observed_generation), (Some(2), Some(2)));
        net.status = Some(first.clone());
        assert!(!needs_write(&net, &desired_status(&net, &invalid, None, at(2000))));
        // Invalid → Overlaps: still False, the time stays, the reason changes.
        let overlaps = Verdict::Overlaps {
            other: "o".into(),
            mine: "10.10.0.0/16".parse().expect("cidr"),
            theirs: "10.10.0.0/24".parse().expect("cidr"),
        };
        let second = desired_status(&net, &overlaps, None, at(3000));
        assert_eq!(second.conditions[0].reason, "Overlaps");
        assert_eq!(second.conditions[0].last_transition_time, Time(at(1000)));
        assert!(needs_write(&net, &second));
        net.status = Some(second);
        // Overlaps → Ready: True, a new time, the DeviceClass named; a new generation shows.
        net.metadata.generation = Some(3);
        let third = desired_status(
            &net,
            &Verdict::Ready,
            Some("n.podnetwork.netclaim.dev".into()),
            at(4000),
        );
        let ready = &third.conditions[0];
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Ready"));
        assert_eq!(ready.last_transition_time, Time(at(4000)));
        assert_eq!((ready.observed_generation, third.observed_generation), (Some(3), Some(3)));
        assert_eq!(third.device_class_name.as_deref(), Some("n.podnetwork.netclaim.dev"));
        net.status = Some(third);
        // Ready → Disabled: False again, another new time.
        let fourth = desired_status(&net, &Verdict::Disabled, None, at(5000));
        assert_eq!(fourth.conditions[0].last_transition_time, Time(at(5000)));
        assert_eq!(fourth.conditions[0].reason, "Disabled");
    }

    #[test]
    fn a_network_being_deleted_says_which_blocks_it_waits_for() {
        let mut net = network("n", 100, &subnets(&["10.10.0.0/16"]));
        net.status = Some(desired_status(&net, &Verdict::Ready, Some("c".into()), at(10)));
        let blocks: Vec<(String, String)> =
            (0..7).map(|i| (format!("n-10-10-{i}-0-24"), format!("node-{i}"))).collect();
        let status = deleting_status(&net, &blocks[..2], at(20));
        let ready = &status.conditions[0];
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::DELETING));
        assert_eq!(ready.last_transition_time, Time(at(20)));
        assert!(
            ready.message.ends_with(
                "waiting for 2 IPBlock(s), which their nodes release at their next release \
                 pass once no pod holds an address in them: n-10-10-0-0-24 (node node-0), \
                 n-10-10-1-0-24 (node node-1)"
            ),
            "{}",
            ready.message
        );
        assert_eq!(status.device_class_name, None);
        assert!(needs_write(&net, &status));
        // Still waiting, fewer blocks: the time stays; many blocks: five named, the rest counted.
        net.status = Some(status);
        let later = deleting_status(&net, &blocks, at(30));
        assert_eq!(later.conditions[0].last_transition_time, Time(at(20)));
        assert!(later.conditions[0].message.ends_with("n-10-10-4-0-24 (node node-4), and 2 more"));
    }

    #[test]
    fn conditions_of_other_types_are_kept() {
        let mut net = network("n", 100, &subnets(&["10.10.0.0/16"]));
        let other = Condition {
            type_: "Synced".into(),
            status: "True".into(),
            reason: "Done".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(at(5)),
        };
        net.status =
            Some(PodNetworkStatus { conditions: vec![other.clone()], ..Default::default() });
        let status = desired_status(&net, &Verdict::Ready, None, at(10));
        assert_eq!(status.conditions.len(), 2);
        assert_eq!(status.conditions[0].type_, "Ready");
        assert_eq!(status.conditions[1], other);
    }
}
