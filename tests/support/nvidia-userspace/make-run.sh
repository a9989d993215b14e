#!/bin/sh
# Writes a stand-in for NVIDIA's userspace installer, DIR/NVIDIA-Linux-x86_64-VERSION.run
# (README.md beside this file says what it imitates and what it does not).
# Usage: make-run.sh VERSION DIR
set -eu
v=$1
dir=$2
mkdir -p "$dir"
out="$dir/NVIDIA-Linux-x86_64-$v.run"
cat > "$out.tmp" <<EOF
#!/bin/sh
# Stand-in for NVIDIA-Linux-x86_64-$v.run (provision's tests/support/nvidia-userspace).
set -eu
V=$v
EOF
cat >> "$out.tmp" <<'EOF'
kernel=1
silent=0
for a in "$@"; do
    case "$a" in
        --no-kernel-module) kernel=0 ;;
        -s|--silent) silent=1 ;;
        -v|--version) echo "NVIDIA-Linux-x86_64-$V.run (stand-in)"; exit 0 ;;
        *) echo "ERROR: Unrecognized option: '$a'" >&2; exit 1 ;;
    esac
done
if [ "$silent" != 1 ]; then
    echo "ERROR: the stand-in runs only with --silent (the real one asks questions otherwise)" >&2
    exit 1
fi
if [ "$kernel" = 1 ]; then
    # Inside a container the module cannot be built or loaded: the node's is used.
    echo "ERROR: Unable to load the kernel module 'nvidia.ko' (stand-in: a container has no kernel of its own; use --no-kernel-module)" >&2
    exit 1
fi
lib=/usr/lib/x86_64-linux-gnu
mkdir -p "$lib" /usr/bin /var/lib/nvidia
# An earlier installation is removed first, as nvidia-installer does.
for name in libcuda libnvidia-ml; do
    for f in "$lib/$name".so.*; do
        [ -e "$f" ] || [ -L "$f" ] || continue
        case "$f" in *.so.1) ;; *) rm -f "$f" ;; esac
    done
    printf 'stand-in %s %s\n' "$name" "$V" > "$lib/$name.so.$V.tmp"
    mv "$lib/$name.so.$V.tmp" "$lib/$name.so.$V"
    ln -sfn "$name.so.$V" "$lib/$name.so.1.tmp" && mv -T "$lib/$name.so.1.tmp" "$lib/$name.so.1"
    ln -sfn "$name.so.1" "$lib/$name.so.tmp" && mv -T "$lib/$name.so.tmp" "$lib/$name.so"
done
cat > /usr/bin/nvidia-smi.tmp <<SMI
#!/bin/sh
# Stand-in nvidia-smi of userspace $V (provision's tests/support/nvidia-userspace).
V=$V
SMI
cat >> /usr/bin/nvidia-smi.tmp <<'SMI'
gpus() { for d in /dev/nvidia[0-9]*; do [ -c "$d" ] && echo "${d#/dev/nvidia}"; done; true; }
n=$(gpus | wc -l)
case "$*" in
    --version) printf 'NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\n' "$V" "${V%.*}" "$V" ;;
    "--query-gpu=driver_version --format=csv,noheader")
        [ "$n" -gt 0 ] || { echo "No devices were found"; exit 6; }
        i=0; while [ "$i" -lt "$n" ]; do echo "$V"; i=$((i+1)); done ;;
    -L)
        [ "$n" -gt 0 ] || { echo "No devices were found"; exit 6; }
        i=0; for m in $(gpus); do echo "GPU $i: NVIDIA H200 (UUID: GPU-5ad1e000-0000-4000-8000-00000000000$m)"; i=$((i+1)); done ;;
    *) echo "stand-in nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
SMI
chmod 0755 /usr/bin/nvidia-smi.tmp
mv /usr/bin/nvidia-smi.tmp /usr/bin/nvidia-smi
echo "$V" > /var/lib/nvidia/version
echo "Installation of the NVIDIA userspace $V (stand-in, no kernel module) is complete."
EOF
chmod 0755 "$out.tmp"
mv "$out.tmp" "$out"
echo "$out"
