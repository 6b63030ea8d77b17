//! Pod attachments in the store: one record per pod UID, so StopPodSandbox and a restarted
//! daemon know which interfaces went into which netns. Written buffered (no `fdatasync`):
//! they describe kernel state that power loss destroys with them (decision 0010).

use std::sync::Arc;

use super::{Durability, Record, Store, StoreError};
use crate::attach::{AttachmentStore, PodAttachment};

impl Record for PodAttachment {
    const KIND: &'static str = "pod-attachments";
    const VERSION: u32 = 1;
}

impl AttachmentStore for Arc<Store> {
    type Error = StoreError;

    fn load_attachments(&self) -> Result<Vec<PodAttachment>, StoreError> {
        self.load_all::<PodAttachment>()?
            .into_iter()
            .map(|(key, record)| {
                if key == record.pod_uid {
                    Ok(record)
                } else {
                    Err(StoreError::KeyMismatch { kind: PodAttachment::KIND, key })
                }
            })
            .collect()
    }

    fn save_attachment(&self, attachment: &PodAttachment) -> Result<(), StoreError> {
        self.put_with(&attachment.pod_uid, attachment, Durability::Buffered)
    }

    fn remove_attachment(&self, pod_uid: &str) -> Result<(), StoreError> {
        self.remove_with::<PodAttachment>(pod_uid, Durability::Buffered).map(|_| ())
    }
}
