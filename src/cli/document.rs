//! A command's data written as JSON or YAML for `-o json|yaml` (`table` is each command's
//! own rendering): the one encoding every data command shares.

use std::io::{self, Write};

use serde::Serialize;

/// Why a document could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// Encoding the document failed.
    #[error("encoding {format} output")]
    Encode {
        /// `json` or `yaml`.
        format: &'static str,
        /// The encoder's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing to stdout failed.
    #[error("writing output")]
    Write(#[from] io::Error),
}

/// `document` as indented JSON, then a newline.
pub fn write_json(document: &impl Serialize, out: &mut impl Write) -> Result<(), DocumentError> {
    serde_json::to_writer_pretty(&mut *out, document)
        .map_err(|err| DocumentError::Encode { format: "json", source: err.into() })?;
    writeln!(out)?;
    Ok(())
}

/// `document` as one YAML document (no `---` line: a stream's caller writes those).
pub fn write_yaml(document: &impl Serialize, out: &mut impl Write) -> Result<(), DocumentError> {
    let text = yaml_serde::to_string(document)
        .map_err(|err| DocumentError::Encode { format: "yaml", source: err.into() })?;
    write!(out, "{text}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_ends_with_a_newline_and_yaml_is_one_document() {
        let document = serde_json::json!({"version": "1", "apis": ["a", "b"]});
        let mut json = Vec::new();
        write_json(&document, &mut json).unwrap();
        assert!(json.ends_with(b"}\n"));
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&json).unwrap(), document);
        let mut yaml = Vec::new();
        write_yaml(&document, &mut yaml).unwrap();
        let text = String::from_utf8(yaml).unwrap();
        assert!(!text.starts_with("---"), "{text}");
        assert_eq!(yaml_serde::from_str::<serde_json::Value>(&text).unwrap(), document);
    }
}
