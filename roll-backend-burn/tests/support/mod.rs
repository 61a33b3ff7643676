//! Test support: fixture paths, a tiny `.npy` reader, comparisons.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use roll_core::strategy::{DeviceSpec, LocalGroup, Messenger};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// `../shared/fixtures/<name>` relative to the workspace root.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(name)
}

/// A small Qwen3-MoE: vocabulary 97, hidden 64, 2 layers, GQA 4/2, head_dim 24, four experts of
/// width 32, two per token.
pub fn qwen3_moe_config() -> roll_backend_burn::HfConfig {
    let mut c = roll_backend_burn::HfConfig::new("qwen3_moe", 97, 64, 96, 2, 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(24);
    c.num_experts = Some(4);
    c.num_experts_per_tok = Some(2);
    c.moe_intermediate_size = Some(32);
    c
}

/// A little-endian f32 `.npy` (v1/v2): its shape and data.
pub fn read_npy(path: &std::path::Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "not a .npy file");
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len]).unwrap();
    assert!(header.contains("'<f4'"), "only little-endian f32: {header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_str = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap();
    let shape: Vec<usize> = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data: Vec<f32> = bytes[start + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(data.len(), shape.iter().product::<usize>(), "npy size");
    (shape, data)
}

/// The reference cases of a fixture: (input ids, prompt text).
pub fn cases(name: &str) -> Vec<(Vec<u32>, String)> {
    let text = std::fs::read_to_string(fixture(name).join("reference/cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["input_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            (ids, c["prompt"].as_str().unwrap().to_string())
        })
        .collect()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A fresh empty directory under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh empty directory named after the test and the process, removed when dropped.
pub fn temp_dir(name: &str) -> TempDir {
    let dir =
        std::env::temp_dir().join(format!("roll-backend-burn-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// Tensors of a safetensors file: name → (dtype, shape, raw bytes).
pub fn read_safetensors(
    path: &std::path::Path,
) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let offsets = v["data_offsets"].as_array().unwrap();
            let (a, b) = (
                offsets[0].as_u64().unwrap() as usize,
                offsets[1].as_u64().unwrap() as usize,
            );
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            (
                k.clone(),
                (
                    v["dtype"].as_str().unwrap().to_string(),
                    shape,
                    data[a..b].to_vec(),
                ),
            )
        })
        .collect()
}

/// The `__metadata__` of a safetensors file.
pub fn safetensors_metadata(path: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].clone()
}

/// Every float parameter of a module by path (LoRA factors under `<weight>.lora.a` / `.b`), or,
/// with `grads`, each one's gradient (a parameter without one, frozen, is left out).
#[derive(Default)]
struct Collect {
    path: Vec<String>,
    out: BTreeMap<String, Vec<f32>>,
    grads: Option<GradientsParams>,
}

impl ModuleVisitor for Collect {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        let t = match &self.grads {
            Some(g) => match g.get::<D>(p.id) {
                Some(t) => t,
                None => return,
            },
            None => p.val(),
        };
        let v: Vec<f32> = t.into_data().convert::<f32>().try_into_vec().unwrap();
        self.out.insert(self.path.join("."), v);
    }
}

/// Every float parameter of `m` by path.
pub fn params<M: Module>(m: &M) -> BTreeMap<String, Vec<f32>> {
    let mut c = Collect::default();
    m.visit(&mut c);
    c.out
}

/// The gradient of every parameter of `m` that has one, by path.
pub fn grads_of<M: Module>(m: &M, grads: GradientsParams) -> BTreeMap<String, Vec<f32>> {
    let mut c = Collect {
        grads: Some(grads),
        ..Default::default()
    };
    m.visit(&mut c);
    c.out
}

/// Runs `body` on every rank of a group of `ranks` threads; the results by rank.
pub fn on_ranks<T: Send>(ranks: usize, body: impl Fn(Arc<dyn Messenger>) -> T + Sync) -> Vec<T> {
    let group = LocalGroup::replicas(vec![DeviceSpec::Cpu; ranks]).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .iter()
            .map(|replica| {
                let body = &body;
                let link: Arc<dyn Messenger> = Arc::new(replica.clone());
                s.spawn(move || body(link))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
