#!/usr/bin/env bash
# The TypeScript package's gate, run by .ci/run after the Rust suite: the
# package's pinned development dependencies (npm ci, package-lock.json),
# its build and a strict type check of it and its tests, `npm pack`, then
# the tarball installed into a fresh project, where the example is compiled
# with `tsc --strict` and every test runs against the installed package: the
# shared corpus through `runloop __replay`, a real `runloop serve` (the five
# outcomes, a refused run, abort, backpressure), and the live page in
# Debian's headless chromium. Needs node (≥ 20) with npm, chromium, and the
# Rust toolchain; exits non-zero on the first failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export RUNLOOP_ROOT="$root"
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

# The tests run the workspace's binary; built already by the Rust suite.
cargo build --quiet --locked -p runloop-cli

cd "$here"
npm ci --loglevel=error                 # its `prepare` builds dist/ (tsc, strict)
node scripts/generate-chunks.mjs --check
npx tsc -p tsconfig.test.json           # the tests, strict, into build/test

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tarball="$work/$(npm pack --silent --pack-destination "$work")"
echo "packed $(basename "$tarball"): $(tar tzf "$tarball" | wc -l) files"
if tar tzf "$tarball" | grep -Ev '^package/(dist/[a-z_]+\.(js|d\.ts)|package\.json|README\.md)$'; then
    echo "ci.sh: the tarball holds files it should not (above)" >&2
    exit 1
fi

# A fresh project: the tarball, and the tools the tests use, at the
# versions package-lock.json pins (from npm's cache, filled by npm ci).
version() { node -p "require('$here/node_modules/$1/package.json').version"; }
mkdir "$work/fresh"
cd "$work/fresh"
printf '{ "name": "fresh", "private": true, "type": "module" }\n' > package.json
npm install --loglevel=error --prefer-offline "$tarball" \
    "typescript@$(version typescript)" "@types/node@$(version @types/node)" \
    "playwright-core@$(version playwright-core)"

# The example compiles under tsc --strict against the installed package.
mkdir example
cp "$here/examples/stream.ts" example/
printf '%s\n' '{ "compilerOptions": { "strict": true, "target": "ES2022", "module": "NodeNext",' \
    '"moduleResolution": "NodeNext", "types": ["node"], "noEmit": true }, "include": ["example"] }' > tsconfig.json
npx tsc -p tsconfig.json
echo "examples/stream.ts compiles under tsc --strict against the installed package"

# Every test, importing "runloop" from the installed tarball.
cp -r "$here/build/test" test
node --test --test-concurrency=1 test/*.test.js
