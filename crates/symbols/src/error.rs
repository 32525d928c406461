//! The crate's error type. Every variant names its input: a file path, or a
//! label such as `kallsyms` for in-memory text, plus the line where one
//! applies.

use std::path::PathBuf;

/// Errors from reading or parsing symbol sources.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// A file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A kallsyms line is malformed.
    #[error("{origin}: line {line}: {reason}")]
    Kallsyms {
        /// The file path, or `kallsyms` for text parsed from memory.
        origin: String,
        /// 1-based line number.
        line: usize,
        reason: String,
    },
    /// An ELF file is malformed or not an ELF file.
    #[error("{origin}: not a usable ELF file: {reason}")]
    Elf {
        /// The file path, or `<memory>` for bytes parsed from memory.
        origin: String,
        reason: String,
    },
}

impl SymbolError {
    /// Replace the origin label of a parse error with a path.
    pub(crate) fn with_origin(self, path: &std::path::Path) -> SymbolError {
        let origin = path.display().to_string();
        match self {
            SymbolError::Kallsyms { line, reason, .. } => SymbolError::Kallsyms {
                origin,
                line,
                reason,
            },
            SymbolError::Elf { reason, .. } => SymbolError::Elf { origin, reason },
            io @ SymbolError::Io { .. } => io,
        }
    }
}
