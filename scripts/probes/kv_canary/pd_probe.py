"""PD pair (prefill + decode with radix + plain) with SGLang's KV canary on both PD servers (probe shim for CPU).
usage: python pd_probe.py MODE PAGE LOGDIR [--faults] [--sweep N] [--no-canary]
MODE log|raise. Phase A: clean multi-turn with shared prefix (remote, decode-local, remote-with-decode-hit),
outputs vs plain. Phase B (--faults): plugin faults on decode + log deltas."""
import sys, time, random, json, re, argparse
import concurrent.futures as cf
from pathlib import Path
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.deployment_requests import new_bootstrap_room

ap = argparse.ArgumentParser()
ap.add_argument("mode"); ap.add_argument("page", type=int); ap.add_argument("logdir")
ap.add_argument("--faults", action="store_true"); ap.add_argument("--sweep", type=int, default=0)
ap.add_argument("--no-canary", action="store_true"); ap.add_argument("--sys-len", type=int, default=720)
ap.add_argument("--only-corrupt", action="store_true"); ap.add_argument("--warmup", action="store_true"); ap.add_argument("--b1only", action="store_true")
a = ap.parse_args()
NEW = 8
canary = () if a.no_canary else ("--kv-canary", a.mode, "--kv-canary-real-data", "partial") + (() if a.warmup else ("--skip-server-warmup",))
dec_extra = canary + (("--disable-cuda-graph",) if canary else ()) + (("--kv-canary-sweep-interval", str(a.sweep)) if a.sweep and not a.no_canary else ())
env = (("CANARY_CPU_SHIM", "1"), ("PYTHONPATH", str(Path(__file__).resolve().parent / "shim")), ("TRITON_INTERPRET", "1"),
       ("CANARY_SHIM_TRACE", "1"), ("SGLANG_PD_LOCAL_PREFILL_TOKENS", "64"),
       ("SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT", "1"), ("SGLANG_KV_CANARY_ENABLE_MHA_V", "1"),
       ("SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "0"), ("SGLANG_KV_CANARY_RING_CAPACITY", "200000"))
cfg = DeploymentConfig(page_size=a.page, with_plain=True, fault_injection=True, log_dir=Path(a.logdir),
                       extra_prefill_args=canary, extra_decode_args=dec_extra,
                       decode_attention_backend="sglang_pd_shared_prefix", env_overrides=env)
dep = PDDeployment(cfg)
T0 = time.monotonic()
def t(): return f"[{time.monotonic() - T0:6.1f}s]"
VIOL = re.compile(r"kv_canary violation: .*")
def log_text(name): return (Path(a.logdir) / f"{name}.log").read_text(errors="replace")
seen = {"decode0": [0, 0], "prefill": [0, 0]}
TR = re.compile(r"canary_shim verify (\S+) n=(\d+) .*new_violations=(\d+)")
def violations(label):
    out = {}
    for name in seen:
        text = log_text(name)
        lines = VIOL.findall(text); tr = TR.findall(text)
        new = lines[seen[name][0]:]; newtr = tr[seen[name][1]:]; seen[name] = [len(lines), len(tr)]
        by_tag = {}
        for tag, n, v in newtr:
            if int(v): by_tag[tag] = by_tag.get(tag, 0) + int(v)
        checked = sum(int(n) for _, n, _ in newtr)
        keys = sorted({(m.group(1), m.group(2)) for l in new for m in [re.search(r"launch_tag=(\S+) fail_reason=(\S+)", l)]})
        slots = sorted({int(re.search(r"slot_idx=(\d+)", l).group(1)) for l in new})
        pos = sorted({int(re.search(r"position=(\d+)", l).group(1)) for l in new})
        out[name] = {"verify_launches": len(newtr), "entries_checked": checked, "violations_by_tag": by_tag,
                     "kinds": keys, "slots": (slots[:4], slots[-2:], len(slots)), "positions": (pos[:4], pos[-2:], len(pos))}
        for l in new[:2]: print(f"   {name}: {l[:230]}")
    alive = {s.name: s.is_running() for s in dep.servers}
    print(f"{t()} {label}: {json.dumps(out)}; alive {alive}", flush=True)
    return out
def same(x, y): return x["output_ids"] == y["output_ids"]
def pd_and_plain(prompt, room=None):
    _, d, room = dep.generate_pd(prompt, NEW, room=room)
    p = dep.generate(dep.plain.url, prompt, NEW)
    return d, p, room
rng = random.Random(7)
tok = lambda n: [rng.randrange(3, 512) for _ in range(n)]
try:
    dep.start(); print(f"{t()} started: {[(s.name, s.port) for s in dep.servers]}", flush=True)
    violations("after start/warmup")
    if not a.only_corrupt:
        S = tok(a.sys_len)
        hist = [S + tok(20) for _ in range(4)]
        for turn, qlen in ((1, 0), (2, 20), (3, 100)):
            prompts = [h + (tok(qlen) if qlen else []) for h in hist]
            with cf.ThreadPoolExecutor(4) as ex:
                res = list(ex.map(lambda pr: dep.generate_pd(pr, NEW), prompts))
            eq = []
            for i, (pr, (_, d, room)) in enumerate(zip(prompts, res)):
                p = dep.generate(dep.plain.url, pr, NEW); eq.append(same(d, p))
                hist[i] = pr + d["output_ids"]
            rooms = dep.prefill_rooms()
            dpl = [rooms.get(r[2], {}).get("decode_prefix_len", "n/a(local)") for r in res]
            st = dep.scheduler_state(dep.decodes[0])
            lp = st["local_prefill"]; sa = st.get("shared_attention", {})
            print(f"{t()} turn {turn}: prompt lens {[len(p) for p in prompts]} equal-to-plain {eq} decode_prefix_len@prefill {dpl}")
            print(f"      local_prefill requests={lp['num_requests']} tokens={lp['num_tokens']} extends={lp['num_extends']} mixed={lp['num_mixed_extends']}")
            print(f"      shared_attention: " + json.dumps({k: v for k, v in sa.items() if k not in ('kernel', 'fallback_layer_calls')})[:400])
            violations(f"turn {turn}")
    if a.faults or a.only_corrupt or a.b1only:
        def arm(fault, room): dep.arm_faults(dep.decodes[0], **{f"{fault}_room": room})
        fired = lambda f: dep.scheduler_state(dep.decodes[0])["faults"]["fired"].get(f, 0)
        # B1 corrupt first transferred page (every layer, noise)
        pr = tok(100 + 2 * a.page); room = new_bootstrap_room(); arm("kv_page_corrupt", room)  # > LOCAL_PREFILL_TOKENS: remote
        try:
            d, p, _ = pd_and_plain(pr, room); print(f"{t()} B1 kv_page_corrupt fired={fired('kv_page_corrupt')} equal-to-plain={same(d, p)}")
        except Exception as e: print(f"{t()} B1 request failed: {str(e)[:200]}")
        time.sleep(3); violations("B1 kv_page_corrupt")
        if a.only_corrupt or a.b1only: raise SystemExit
        # B2 prefix one page ahead (decode keeps a page it never received)
        primed = tok(2 * a.page + 3); dep.generate_pd(primed, NEW)
        pr = primed + tok(3 * a.page + 70); room = new_bootstrap_room(); arm("prefix_page_ahead", room)
        d, p, _ = pd_and_plain(pr, room); print(f"{t()} B2 prefix_page_ahead fired={fired('prefix_page_ahead')} equal-to-plain={same(d, p)} dpl={dep.prefill_rooms()[room]['decode_prefix_len']}")
        time.sleep(3); violations("B2 prefix_page_ahead")
        # B3 local extend writes each KV one slot off
        base = tok(100); d0, _, _ = pd_and_plain(base)
        pr = base + d0["output_ids"] + tok(30); room = new_bootstrap_room(); arm("local_extend_kv_shift", room)
        d, p, _ = pd_and_plain(pr, room); print(f"{t()} B3 local_extend_kv_shift fired={fired('local_extend_kv_shift')} equal-to-plain={same(d, p)}")
        time.sleep(3); violations("B3 local_extend_kv_shift")
        # B4 shared-prefix attention merges partials wrongly (attention backend bug)
        S2 = tok(a.sys_len); dep.generate_pd(S2 + tok(5), NEW)
        dep.arm_faults(dep.decodes[0], shared_merge_average=20)
        prompts = [S2 + tok(80) for _ in range(4)]
        with cf.ThreadPoolExecutor(4) as ex: res = list(ex.map(lambda pr: dep.generate_pd(pr, NEW), prompts))
        eq = [same(r[1], dep.generate(dep.plain.url, pr, NEW)) for r, pr in zip(res, prompts)]
        print(f"{t()} B4 shared_merge_average fired={fired('shared_merge_average')} equal-to-plain={eq}")
        time.sleep(3); violations("B4 shared_merge_average")
except SystemExit:
    pass
except Exception as e:
    print(f"{t()} ERROR {type(e).__name__}: {str(e)[:1500]}")
    try: violations("at error")
    except Exception: pass
finally:
    dep.stop(); print(f"{t()} stopped", flush=True)
