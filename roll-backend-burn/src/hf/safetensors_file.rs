//! A minimal safetensors writer for tensors that are not fields of a module (LoRA factors under
//! PEFT's names): the 8-byte little-endian header length, the JSON header (`dtype`, `shape`,
//! `data_offsets` per tensor, `__metadata__`), padded with spaces to a multiple of 8 bytes, then
//! the raw little-endian data in header order.

use super::save::SaveDtype;
use crate::{BackendError, Result};
use burn::tensor::{bf16, f16};
use std::path::Path;

/// One tensor to write: row-major f32 values converted to the file's dtype on writing.
pub(crate) struct F32Tensor {
    /// Name in the file.
    pub(crate) name: String,
    /// Shape (row-major).
    pub(crate) shape: Vec<usize>,
    /// Values, `shape.iter().product()` of them.
    pub(crate) values: Vec<f32>,
}

/// The safetensors name of a dtype.
fn dtype_name(dtype: SaveDtype) -> &'static str {
    match dtype {
        SaveDtype::F32 => "F32",
        SaveDtype::Bf16 => "BF16",
        SaveDtype::F16 => "F16",
    }
}

fn encode(values: &[f32], dtype: SaveDtype) -> Vec<u8> {
    match dtype {
        SaveDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        SaveDtype::Bf16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        SaveDtype::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

/// Writes `tensors` (sorted by name, as `safetensors` does) in `dtype` to `path`, with
/// `{"format": "pt"}` metadata, which transformers and PEFT require.
///
/// # Errors
/// [`BackendError::Save`] for a tensor whose values do not fill its shape or a duplicate name,
/// [`BackendError::Io`] if the file cannot be written.
pub(crate) fn write_safetensors(
    path: &Path,
    mut tensors: Vec<F32Tensor>,
    dtype: SaveDtype,
) -> Result<()> {
    let save_error = |message: String| BackendError::Save {
        path: path.to_path_buf(),
        message,
    };
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut data = Vec::new();
    for t in &tensors {
        if t.values.len() != t.shape.iter().product::<usize>() {
            return Err(save_error(format!(
                "tensor `{}` has {} values for shape {:?}",
                t.name,
                t.values.len(),
                t.shape
            )));
        }
        let start = data.len();
        data.extend(encode(&t.values, dtype));
        let entry = serde_json::json!({
            "dtype": dtype_name(dtype),
            "shape": t.shape,
            "data_offsets": [start, data.len()],
        });
        if header.insert(t.name.clone(), entry).is_some() {
            return Err(save_error(format!("tensor `{}` is written twice", t.name)));
        }
    }
    let mut json = serde_json::to_vec(&header).map_err(|e| save_error(e.to_string()))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut bytes = Vec::with_capacity(8 + json.len() + data.len());
    bytes.extend((json.len() as u64).to_le_bytes());
    bytes.extend(json);
    bytes.extend(data);
    std::fs::write(path, bytes).map_err(|e| BackendError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_format() {
        let dir = std::env::temp_dir().join(format!("roll-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.safetensors");
        let tensors = vec![
            F32Tensor {
                name: "b".into(),
                shape: vec![2],
                values: vec![1.0, -2.0],
            },
            F32Tensor {
                name: "a".into(),
                shape: vec![1, 1],
                values: vec![0.5],
            },
        ];
        write_safetensors(&path, tensors, SaveDtype::Bf16).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        assert_eq!(header["__metadata__"]["format"], "pt");
        // Sorted by name: `a` first, 2 bytes per bf16 value.
        assert_eq!(header["a"]["data_offsets"], serde_json::json!([0, 2]));
        assert_eq!(header["b"]["data_offsets"], serde_json::json!([2, 6]));
        assert_eq!(header["b"]["dtype"], "BF16");
        // bf16 is the top half of the f32 bits for exactly representable values.
        let data = &bytes[8 + n..];
        assert_eq!(data[..2], (0.5f32.to_bits() >> 16).to_le_bytes()[..2]);
        assert_eq!(data[4..6], ((-2.0f32).to_bits() >> 16).to_le_bytes()[..2]);
        let bad = vec![F32Tensor {
            name: "x".into(),
            shape: vec![3],
            values: vec![1.0],
        }];
        assert!(matches!(
            write_safetensors(&path, bad, SaveDtype::F32),
            Err(BackendError::Save { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
