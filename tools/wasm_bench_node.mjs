// The Node half of tools/wasm_bench.py: reads the op sequences (JSON on
// stdin), runs each through the Wasm module in V8 `reps` times, timing only
// the ABI calls with their document copies, and prints the median
// microseconds per operation as a JSON array.
import fs from "node:fs";
import { performance } from "node:perf_hooks";
import { loadChstate } from "../hosts/wasi/chstate_wasi.mjs";

const [wasm, repsText] = process.argv.slice(2);
const reps = Number(repsText);
const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const mod = await loadChstate(wasm);
const enc = new TextEncoder();
const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const empty = [];
for (let r = 0; r < reps; r++) {
  const t0 = performance.now();
  mod.x.chstate_abi_version();
  empty.push((performance.now() - t0) * 1000);
}
const medians = [median(empty)];
for (const c of cases) {
  const random = Buffer.from(c.random_hex, "hex");
  const [rp, rn] = random.length ? mod.input(random, "random_fixed") : [0, 0];
  const handle = c.store ? mod.storeNew(JSON.stringify(c.store)).store : 0;
  const steps = c.steps.map((s) => ({ call: s.call, now: BigInt(s.now_ms), doc: enc.encode(s.doc), expect: s.expect }));
  const times = [];
  for (let r = 0; r < reps; r++) {
    let total = 0;
    for (const s of steps) {
      const t0 = performance.now();
      const [p, n] = mod.input(s.doc);
      let got;
      if (s.call === "resolve_settings") got = mod.output((o, cap) => mod.x.chstate_resolve_settings(p, n, o, cap));
      else got = mod.output((o, cap) => mod.x[s.call === "start" ? "chstate_op_start" : "chstate_op_feed"](handle, p, n, s.now, rp, rn, o, cap));
      total += performance.now() - t0;
      // The first run's answers must be the vector's (or, for a changed case, not a failure).
      if (r === 0 && (s.expect !== null ? got !== s.expect : got.startsWith('{"failed"'))) {
        throw new Error(`wasm_bench_node: ${c.label}, ${s.call}: got ${got.slice(0, 300)}, want ${String(s.expect).slice(0, 300)}`);
      }
    }
    times.push(total * 1000);
  }
  if (handle) mod.x.chstate_store_free(handle);
  medians.push(median(times));
}
console.log(JSON.stringify(medians));
