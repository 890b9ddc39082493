// Set-up steps of the layers above the runtime (the operator layer's per-accelerator kernel
// registrations), run once when the flagos device is first initialised, whatever the first call is
// (torch.flagos._lazy_init, a tensor on flagos, pin_memory(), torch.Generator("flagos"), ...).
#pragma once

namespace flagos::runtime {

using SetupStep = void (*)();

// Registers a step; call during static initialisation (a registrar object), before the device can be
// initialised. Steps run in registration order, on the thread that initialises the device, after the
// runtime mode is initialised; they may use the runtime (it does not re-enter initialisation).
void add_setup_step(SetupStep step);

// Initialises the device once (the runtime mode, then the set-up steps); cheap once done. Throws when no
// accelerator can be used. A step that throws leaves the device uninitialised: the next call retries.
void initialize();
// initialize() for torch's own lazy initialisation of the device (the hooks' init(), called inside
// at::Context::lazyInitDevice, which initialize() otherwise calls once it is done).
void initialize_for_torch();

}  // namespace flagos::runtime
