//! The Vulkan device (feature `wgpu`): a GPU's driver, or Mesa's lavapipe on a machine without one.

use crate::{BackendError, Result};
use burn::tensor::wgpu::WgpuBackend;
use burn::tensor::{Device, DeviceKind};
use std::sync::OnceLock;

/// The wgpu device on Vulkan: `index` 0 is the best adapter the machine has (a discrete GPU if
/// there is one; on a machine without a GPU, Mesa's lavapipe), `index` N ≥ 1 the N-th discrete
/// GPU. Initialised once per process; later calls return the same device.
///
/// # Errors
/// [`BackendError::InvalidInput`] if no Vulkan adapter answers (no GPU driver, no
/// `mesa-vulkan-drivers`).
pub fn vulkan_device(index: usize) -> Result<Device> {
    static DEVICES: OnceLock<std::sync::Mutex<Vec<(usize, Device)>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    let mut devices = devices
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, device)) = devices.iter().find(|(i, _)| *i == index) {
        return Ok(device.clone());
    }
    let kind = match index {
        0 => DeviceKind::DefaultDevice,
        n => DeviceKind::DiscreteGpu(n),
    };
    let device = Device::wgpu_options()
        .graphics_api(WgpuBackend::Vulkan)
        .device_kind(kind)
        .init()
        .map_err(|e| {
            BackendError::InvalidInput(format!(
                "no Vulkan adapter for vulkan:{index} ({e}); on a machine without a GPU, \
                 install Mesa's lavapipe (Debian `mesa-vulkan-drivers`)"
            ))
        })?;
    devices.push((index, device.clone()));
    Ok(device)
}
