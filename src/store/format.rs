//! The journal's bytes: the header line, the checksummed entry lines of put/remove
//! operations, their sizes, the snapshot written by a compaction, and a stored record decoded
//! (and migrated) into its type.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::{Record, StoreError};

/// The `format` of the header line.
pub(super) const FORMAT_NAME: &str = "netclaim-state";
/// The journal format written by this build. A release refuses a journal of a newer format
/// (`NewerFormat`, which says how to roll back) rather than read records whose absence or
/// meaning it would get wrong; an older journal is rewritten in the current format when
/// opened (the records themselves migrate per kind).
/// - 2: the IPAM kinds `ipam-released` (quarantine) and `ipam-blocks` (owned `IPBlock`s):
///   a release before them would hand out quarantined addresses and forget its blocks.
/// - 3: VF records keyed by PCI address with the boot id of their "before" values
///   (`prepared-claims` version 6, `vf-snapshots` version 2; decision 0018): a release before
///   them would find a VF by a PF name that may have changed at boot and set back values of
///   an earlier boot; and the ipam releasing intents (`ipam-block-releases`: the record an `IPBlock` release
///   writes before it deletes the block; decision 0017), which a release before would not finish.
/// - 4: the kinds `vfio-bindings` (a function bound to vfio-pci for a claim, written before
///   the first sysfs write; decision 0019) and `ethtool-snapshots` (a device's ethtool values
///   before a claim changed them; decision 0020), and prepared claims and pod attachments
///   that carry RDMA, routing, VRF, sysctl and bandwidth-ceiling state (decisions 0019–0021):
///   a release before them would leave a function on vfio-pci, keep a claim's ethtool values
///   and fail to read the plans it must undo.
pub const FORMAT_VERSION: u32 = 4;
/// Hex digits of the SHA-256 prefix that guards each line.
pub(super) const CHECKSUM_HEX: usize = 16;

/// The journal header line.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Header {
    pub(super) format: String,
    pub(super) version: u32,
}

/// One operation of a committed batch. A record's data stays the JSON text it was written
/// as, in memory too: a tree of `serde_json::Value`s took several times the text's size for
/// every record the daemon keeps (a prepared claim, a pod's interfaces), and was built only to
/// be written out or decoded once.
#[derive(Debug, Clone)]
pub(super) enum Op {
    Put { kind: String, key: String, version: u32, data: Box<RawValue> },
    Remove { kind: String, key: String },
}

/// An [`Op`] as a journal line spells it: `{"op":"put","kind":…,"key":…,"version":…,
/// "data":{…}}` or `{"op":"remove","kind":…,"key":…}`. A struct rather than an internally
/// tagged enum: serde buffers such an enum's fields, and raw JSON cannot pass through that.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OpLine {
    op: OpName,
    kind: String,
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<Box<RawValue>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum OpName {
    Put,
    Remove,
}

impl Serialize for Op {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct OpLineRef<'a> {
            op: OpName,
            kind: &'a str,
            key: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            version: Option<u32>,
            #[serde(skip_serializing_if = "Option::is_none")]
            data: Option<&'a RawValue>,
        }
        let line = match self {
            Op::Put { kind, key, version, data } => {
                OpLineRef { op: OpName::Put, kind, key, version: Some(*version), data: Some(data) }
            }
            Op::Remove { kind, key } => {
                OpLineRef { op: OpName::Remove, kind, key, version: None, data: None }
            }
        };
        line.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let line = OpLine::deserialize(deserializer)?;
        match (line.op, line.version, line.data) {
            (OpName::Put, Some(version), Some(data)) => {
                Ok(Op::Put { kind: line.kind, key: line.key, version, data })
            }
            (OpName::Put, None, _) => Err(D::Error::missing_field("version")),
            (OpName::Put, _, None) => Err(D::Error::missing_field("data")),
            (OpName::Remove, None, None) => Ok(Op::Remove { kind: line.kind, key: line.key }),
            (OpName::Remove, _, _) => {
                Err(D::Error::custom("a remove carries no version and no data"))
            }
        }
    }
}

/// One journal line.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
    pub(super) ops: Vec<Op>,
}

/// A record as held in memory: its schema version and its data as JSON text.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    pub(super) version: u32,
    pub(super) data: Box<RawValue>,
    /// Encoded size, for the compaction threshold.
    pub(super) bytes: u64,
}

/// The JSON of one journal entry, byte for byte what serialising [`EntryRef`] gives (the
/// compact formatter: `{"ops":[op,op]}`), with each op's size measured on the way: the
/// entry is serialised once, not again per record to size it.
pub(super) fn encode_entry(ops: &[Op]) -> Result<(String, Vec<u64>), StoreError> {
    let encode_error = |source| StoreError::Encode { kind: "journal", key: String::new(), source };
    let mut json = Vec::with_capacity(512);
    json.extend_from_slice(b"{\"ops\":[");
    let mut sizes = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        let start = json.len();
        serde_json::to_writer(&mut json, op).map_err(encode_error)?;
        sizes.push(op_size(json.len() - start));
    }
    json.extend_from_slice(b"]}");
    // serde_json writes valid UTF-8.
    let json = String::from_utf8(json).map_err(|err| {
        encode_error(serde::ser::Error::custom(format!("journal entry is not UTF-8: {err}")))
    })?;
    Ok((json, sizes))
}

/// The compaction estimate of a record from its encoded op (which carries kind, key and
/// version next to the data, as a snapshot line does).
pub(super) fn op_size(encoded: usize) -> u64 {
    encoded as u64 + 64
}

/// Serialises a borrowed batch the same way as [`Entry`].
#[derive(Serialize)]
pub(super) struct EntryRef<'a> {
    pub(super) ops: &'a [Op],
}

pub(super) fn encoded_size(data: &RawValue) -> u64 {
    // Key and envelope overhead are small next to the data; this only steers compaction.
    data.get().len() as u64 + 64
}

pub(super) fn checksum(json: &str) -> String {
    let digest = Sha256::digest(json.as_bytes());
    digest.iter().take(CHECKSUM_HEX / 2).fold(String::with_capacity(CHECKSUM_HEX), |mut s, b| {
        use std::fmt::Write as _;
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `<checksum> <json>\n`
pub(super) fn encode_line(json: &str) -> String {
    format!("{} {json}\n", checksum(json))
}

/// A complete journal holding `records`: the header, then one put per record.
pub(super) fn snapshot_text(
    records: &BTreeMap<(String, String), Stored>,
) -> Result<String, StoreError> {
    let mut text =
        serde_json::to_string(&Header { format: FORMAT_NAME.to_owned(), version: FORMAT_VERSION })
            .map_err(|source| StoreError::Encode { kind: "journal", key: String::new(), source })?;
    text.push('\n');
    for ((kind, key), stored) in records {
        let ops = [Op::Put {
            kind: kind.clone(),
            key: key.clone(),
            version: stored.version,
            data: stored.data.clone(),
        }];
        let json = serde_json::to_string(&EntryRef { ops: &ops })
            .map_err(|source| StoreError::Encode { kind: "journal", key: key.clone(), source })?;
        text.push_str(&encode_line(&json));
    }
    Ok(text)
}

/// Decodes a stored record: `(record, whether it was migrated)`.
pub(super) fn decode_record<R: Record>(
    key: &str,
    stored: &Stored,
) -> Result<(R, bool), StoreError> {
    if stored.version > R::VERSION {
        return Err(StoreError::NewerVersion {
            kind: R::KIND,
            key: key.to_owned(),
            version: stored.version,
            supported: R::VERSION,
        });
    }
    let decode_error = |source| StoreError::Decode { kind: R::KIND, key: key.to_owned(), source };
    if stored.version == R::VERSION {
        let record = serde_json::from_str(stored.data.get()).map_err(decode_error)?;
        return Ok((record, false));
    }
    // Migrations work on a tree, once per record and release.
    let mut data: Value = serde_json::from_str(stored.data.get()).map_err(decode_error)?;
    for from in stored.version..R::VERSION {
        data = R::migrate(from, data).map_err(|reason| StoreError::Migrate {
            kind: R::KIND,
            key: key.to_owned(),
            from,
            reason,
        })?;
    }
    let record = serde_json::from_value(data).map_err(decode_error)?;
    Ok((record, true))
}
