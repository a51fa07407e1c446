import json, threading, time, uuid
import httpx
from tests.app.conftest import start_edge, stop_edge, PAID
from tests import http_calls

def test_repro(database_url, edge_specs_dir, edge_logs, make_customer):
    edge = start_edge(database_url, edge_specs_dir, edge_logs, "repro")
    try:
        c = make_customer(credits=100)
        h = {**c.headers, "Content-Type": "application/json"}
        parts = {"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-1","role":"ROLE_USER","parts":[{"text":"a"}]*100_000}}}
        keys = {"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-2","role":"ROLE_USER","parts":[{"text":"a"}],"metadata":{f"k{i}":1 for i in range(150_000)}}}}
        for label, body in (("parts", parts), ("keys", keys)):
            raw = json.dumps(body, separators=(",", ":")).encode()
            out = {}
            def send():
                t = time.perf_counter()
                r = http_calls.post(f"{edge.specialist('conformance')}/jsonrpc", content=raw, headers=h)
                out["t"] = time.perf_counter() - t; out["r"] = r.text[:200]
            th = threading.Thread(target=send); th.start()
            worst = 0
            while th.is_alive():
                t = time.perf_counter(); http_calls.get(f"{edge.url}/healthz"); worst = max(worst, time.perf_counter() - t)
            th.join()
            print(f"\n{label}: {len(raw)} bytes answered in {out['t']:.2f}s: {out['r']}; worst healthz {worst:.2f}s")
        for token in ("AAAA",):
            for url, kw in ((f"{edge.specialist(PAID)}/jsonrpc", dict(json={"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageToken":token}})),):
                r = http_calls.post(url, headers=c.headers, **kw); print("\nListTasks rpc", r.status_code, r.text[:600])
            r = http_calls.get(f"{edge.specialist(PAID)}/tasks", params={"pageToken": token}, headers=c.headers); print("\nListTasks rest", r.status_code, r.text[:600])
        def send(meta=None, raw=None):
            m = {"messageId": f"m-{uuid.uuid4()}", "role":"ROLE_USER","parts":[{"text":"hi"}]}
            body = raw or json.dumps({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":m, "configuration": {"returnImmediately": True}}})
            return http_calls.post(f"{edge.specialist('conformance')}/jsonrpc", content=body, headers=h)
        for raw in ('{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-x1","role":"ROLE_USER","parts":[{"text":"hi"}],"metadata":{"credit_ceiling":1e999}}}}',
                    '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-x2","role":"ROLE_USER","parts":[{"text":"hi"}],"metadata":{"credit_ceiling":NaN}}}}',
                    '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-x3","role":"ROLE_USER","parts":[{"data":{"v":1e999}}]}}}',
                    '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-x4","role":"ROLE_USER","parts":[{"data":{"v":' + "9"*5000 + '}}]}}}'):
            r = send(raw=raw); print("\n", raw[:90], "->", r.status_code, r.text[:300])
        fat = {"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"configuration":{"returnImmediately":True},"message":{"messageId":f"m-{uuid.uuid4()}","role":"ROLE_USER","parts":[{"url":"http://x/y","filename":"f"*1_900_000}]}}}
        r = send(raw=json.dumps(fat)); print("\nfilename 1.9MB ->", r.status_code, r.text[:200])
        fat = {"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"configuration":{"returnImmediately":True},"message":{"messageId":f"m-{uuid.uuid4()}","role":"ROLE_USER","parts":[{"text":"hi"}],"referenceTaskIds":[str(uuid.uuid4()) for _ in range(50_000)]}}}
        r = send(raw=json.dumps(fat)); print("\nrefids ->", len(json.dumps(fat)), r.status_code, r.text[:200])
        fat = {"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"configuration":{"returnImmediately":True},"message":{"messageId":f"m-{uuid.uuid4()}","role":"ROLE_USER","parts":[{"text":"hi"}],"extensions":["urn:"+"x"*1_900_000]}}}
        r = send(raw=json.dumps(fat)); print("\next uri ->", r.status_code, r.text[:200])
        print(edge.log_text()[-3000:])
    finally:
        stop_edge(edge)
