#!/bin/sh
# Packs a machine's own NVIDIA userspace driver files into a `.run`-shaped installer,
# OUT/NVIDIA-Linux-x86_64-VERSION.run, installed as provision runs NVIDIA's
# (`sh FILE --no-kernel-module --silent`): the real libraries and tools, not stand-ins.
# Used on the lent H200 machine (scripts/gpu-lxc-h200 userspace), whose driver's userspace
# is a read-only folder and whose `.run` is not there. README.md beside this says what it
# installs and what it does not.
# Usage: pack-run.sh VERSION SRC OUT   (SRC holds lib64/ and bin/, e.g. /usr/local/nvidia)
set -eu
v=$1
src=$2
out=$3
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/bin"
# nvidia-container-toolkit's `compute` and `utility` sets: what CUDA and NVML need.
for name in libcuda libcudadebugger libnvidia-ml libnvidia-cfg libnvidia-ptxjitcompiler \
    libnvidia-nvvm libnvidia-gpucomp libnvidia-opencl libnvidia-allocator \
    libnvidia-pkcs11-openssl3; do
    for f in "$src/lib64/$name".so*; do
        [ -e "$f" ] || continue
        cp -P "$f" "$stage/lib/"
    done
done
for b in nvidia-smi nvidia-debugdump nvidia-persistenced nvidia-cuda-mps-control nvidia-cuda-mps-server; do
    [ -f "$src/bin/$b" ] && cp "$src/bin/$b" "$stage/bin/"
done
[ -f "$stage/lib/libcuda.so.$v" ] || { echo "no $src/lib64/libcuda.so.$v: not driver $v" >&2; exit 1; }
run="$out/NVIDIA-Linux-x86_64-$v.run"
cat > "$run.tmp" <<HDR
#!/bin/sh
# NVIDIA userspace $v packed from a machine's own driver files (provision's
# tests/support/nvidia-userspace/pack-run.sh); the payload is a tar after the marker line.
set -eu
V=$v
HDR
cat >> "$run.tmp" <<'HDR'
kernel=1
silent=0
for a in "$@"; do
    case "$a" in
        --no-kernel-module) kernel=0 ;;
        -s|--silent) silent=1 ;;
        -v|--version) echo "NVIDIA-Linux-x86_64-$V.run (packed)"; exit 0 ;;
        *) echo "ERROR: Unrecognized option: '$a'" >&2; exit 1 ;;
    esac
done
[ "$silent" = 1 ] || { echo "ERROR: runs only with --silent" >&2; exit 1; }
[ "$kernel" = 0 ] || { echo "ERROR: Unable to load the kernel module 'nvidia.ko' (a container has no kernel of its own; use --no-kernel-module)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
line=$(awk '/^__PAYLOAD__$/ { print NR + 1; exit }' "$0")
tail -n +"$line" "$0" | tar -x -C "$tmp"
lib=/usr/lib/x86_64-linux-gnu
mkdir -p "$lib" /usr/bin /var/lib/nvidia
# An earlier installation is removed first, as nvidia-installer does.
for f in "$tmp"/lib/*.so."$V"; do
    name=$(basename "$f" ".so.$V")
    for old in "$lib/$name".so.*; do
        [ -e "$old" ] || [ -L "$old" ] || continue
        rm -f "$old"
    done
done
# Files first, then the links that name them, each renamed into place.
for f in "$tmp"/lib/* "$tmp"/bin/*; do
    case "$f" in */lib/*) to=$lib ;; *) to=/usr/bin ;; esac
    [ -L "$f" ] && continue
    cp "$f" "$to/.$(basename "$f").tmp" && chmod 0755 "$to/.$(basename "$f").tmp"
    mv "$to/.$(basename "$f").tmp" "$to/$(basename "$f")"
done
for f in "$tmp"/lib/*; do
    [ -L "$f" ] || continue
    ln -sfn "$(readlink "$f")" "$lib/.$(basename "$f").tmp"
    mv -T "$lib/.$(basename "$f").tmp" "$lib/$(basename "$f")"
done
ldconfig
echo "$V" > /var/lib/nvidia/version
echo "Installation of the NVIDIA userspace $V (packed from the machine's driver, no kernel module) is complete."
exit 0
__PAYLOAD__
HDR
tar -C "$stage" -cf - lib bin >> "$run.tmp"
chmod 0755 "$run.tmp"
mv "$run.tmp" "$run"
echo "$run"
