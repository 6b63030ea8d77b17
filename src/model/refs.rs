//! References to the Kubernetes objects a claim's life touches: the ResourceClaim (as kubelet
//! names it, and as its status is written) and the Pod that uses it.

/// A `ResourceClaim` by namespace, name and UID: how kubelet names a claim in
/// `NodePrepareResources`, and what a status write checks (a claim replaced by another one of
/// the same name has another UID).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimRef {
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// UID of the claim; the key of every per-claim answer.
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// A Pod by namespace, name and UID (what an Event on the Pod names).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the pod.
    pub name: String,
    /// UID of the pod.
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}
