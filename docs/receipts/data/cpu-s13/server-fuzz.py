import json, random, requests, sys
random.seed(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
U = "http://127.0.0.1:8095"
MID = requests.get(U+"/v1/models").json()["data"][0]["id"]
bases = {
 "/v1/chat/completions": {"model":MID,"messages":[{"role":"user","content":"hi"}],"max_tokens":4},
 "/v1/completions": {"model":MID,"prompt":"hi","max_tokens":4},
 "/v1/responses": {"model":MID,"input":"hi","max_output_tokens":4},
 "/v1/messages": {"model":MID,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]},
 "/v1/messages/count_tokens": {"model":MID,"messages":[{"role":"user","content":"hi"}]},
 "/tokenize": {"content":"hi"},
 "/detokenize": {"tokens":[1,2,3]},
}
weird = [None, True, -1, 0, 2**63, -2**63, 2**64, 1e308, -1e308, 1.5, "", "x"*5, [], {}, [None], [1e40], {"a":1}, "NaN", 4294967296, 65536, -0.0, [-1], [2**40], [{"type":"text"}], [{"type":"image_url","image_url":{"url":"x"}}]]
keys = ["max_tokens","temperature","top_p","top_k","min_p","n","seed","stop","logprobs","top_logprobs","stream","stream_options","tools","tool_choice","messages","prompt","input","system","content","tokens","frequency_penalty","presence_penalty","echo","instructions","max_completion_tokens","stop_sequences","logit_bias","best_of","suffix","add_special","with_pieces","response_format","parallel_tool_calls","max_output_tokens","text","metadata"]
def mutate(o, depth=0):
    o = json.loads(json.dumps(o))
    for _ in range(random.randint(1,3)):
        k = random.choice(keys)
        o[k] = random.choice(weird)
    if isinstance(o.get("messages"), list) and o["messages"] and random.random()<0.5:
        m = o["messages"][0]
        if isinstance(m, dict):
            m[random.choice(["role","content","tool_calls","name","tool_call_id"])] = random.choice(weird + ["tool","assistant","system","developer","bogus"])
    return o
bad = 0
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 300):
    ep = random.choice(list(bases))
    body = mutate(bases[ep])
    try:
        r = requests.post(U+ep, data=json.dumps(body, allow_nan=True), headers={"content-type":"application/json"}, timeout=60)
        txt = r.text
        if r.status_code >= 500 or (r.status_code >= 400 and "error" not in txt):
            bad += 1; print("BAD", r.status_code, ep, json.dumps(body)[:300], txt[:300])
    except Exception as e:
        bad += 1; print("EXC", ep, json.dumps(body)[:300], e)
h = requests.get(U+"/health").status_code
print("done bad", bad, "health", h)
