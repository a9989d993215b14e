//! GPU facts on the node and checks in the guest (NVIDIA), and the NCCL preflight.
