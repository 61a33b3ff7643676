//! From a config's device name to a Burn device.

use crate::{BackendError, Result};
use burn::tensor::Device;
use roll_core::strategy::DeviceSpec;

/// The Burn device for `spec`: `cpu` is the Flex CPU backend; `cuda:N` needs the `cuda`
/// feature, `vulkan:N` the `wgpu` feature (`gpu::vulkan_device` says which
/// adapter an index names).
///
/// Always name the device explicitly: Burn's `Device::default()` silently moves to a GPU when a
/// GPU backend is compiled in.
///
/// # Errors
/// [`BackendError::BackendNotBuilt`] for a device whose backend is not compiled in.
///
/// # Example
/// ```
/// use roll_backend_burn::{device, DeviceSpec};
/// let cpu = device(DeviceSpec::Cpu).unwrap();
/// # #[cfg(not(feature = "wgpu"))]
/// assert!(device(DeviceSpec::Vulkan(0)).is_err());
/// # let _ = cpu;
/// ```
pub fn device(spec: DeviceSpec) -> Result<Device> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::flex()),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(index) => Ok(Device::cuda(index)),
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => Err(BackendError::BackendNotBuilt {
            device: spec,
            feature: "cuda",
        }),
        #[cfg(feature = "wgpu")]
        DeviceSpec::Vulkan(index) => crate::gpu::vulkan_device(index),
        #[cfg(not(feature = "wgpu"))]
        DeviceSpec::Vulkan(_) => Err(BackendError::BackendNotBuilt {
            device: spec,
            feature: "wgpu",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Tensor, TensorData};

    #[test]
    fn cpu_device_runs_tensor_math() {
        let dev = device(DeviceSpec::Cpu).unwrap();
        let x = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [3]), &dev);
        let s: f32 = x.sum().into_scalar();
        assert_eq!(s, 6.0);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn gpu_devices_without_their_feature_name_the_feature() {
        let err = device(DeviceSpec::Cuda(1)).unwrap_err().to_string();
        assert!(
            err.contains("cuda:1") && err.contains("`cuda` feature"),
            "{err}"
        );
    }
}
