#!/usr/bin/env bash
# Fuzzes one target on one core for a while, then minimises its corpus in place.
#   fuzz/run.sh inventory 900      # 15 minutes
#   fuzz/run.sh pve_config 600
# Seeds come from the repository (inventories, bad-input fixtures, Proxmox configs); new
# inputs land in fuzz/corpus/TARGET, crashes in fuzz/artifacts/TARGET. See docs/fuzz.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: fuzz/run.sh inventory|pve_config [seconds]}
secs=${2:-600}
# The same build flags for build, run and cmin, or cargo fuzz rebuilds everything.
flags=(--sanitizer none)
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
case $target in
  inventory)
    cp "$root"/inventory/*.yaml "$root"/examples/*.yaml "$root"/tests/fixtures/*.yaml \
      "$root"/tests/fixtures/bad/*.yaml "$seeds"/
    ;;
  pve_config) cp "$root"/fuzz/seeds/pve_config/* "$seeds"/ ;;
  *) echo "unknown target $target" >&2; exit 1 ;;
esac
corpus=$root/fuzz/corpus/$target
mkdir -p "$corpus"
cd "$root/fuzz"
cargo +nightly fuzz run "${flags[@]}" "$target" "$corpus" "$seeds" -- \
  -dict="$root/fuzz/dict/${target%%_*}.dict" -max_len=8192 -timeout=10 \
  -rss_limit_mb=2048 -max_total_time="$secs" -print_final_stats=1
# Edges only (no hit counts): keeps the corpus to a few hundred files.
cargo +nightly fuzz cmin "${flags[@]}" "$target" "$corpus" -- -use_counters=0 -max_len=8192 -timeout=10
echo "corpus: $(find "$corpus" -type f | wc -l) files, $(du -sh "$corpus" | cut -f1)"
