"""What Kubernetes makes of a rendered manifest (tests/cli/k8s_cli_test.sh): pod 0's DNS
name, and each pod's environment and argv, computed as the Job controller and the
kubelet would. Only the standard library: the JSON form (--format json) is read."""
import json
import subprocess

INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

def expand(s, env):
    """Kubernetes' $(VAR) expansion of command and args (third_party/forked/golang/expansion):
    $$ -> $, $(NAME) -> its value when NAME is in the container's env, else left as is."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt == "$":
                out.append("$"); i += 2; continue
            if nxt == "(":
                close = s.find(")", i + 2)
                if close != -1:
                    name = s[i + 2:close]
                    out.append(env[name] if name in env else "$(" + name + ")")
                    i = close + 1; continue
                out.append("$("); i += 2; continue
            out.append("$" + nxt); i += 2; continue
        out.append(s[i]); i += 1
    return "".join(out)

assert expand("a$$b$(X)$(Y)$$(X)$(", {"X": "1"}) == "a$b1$(Y)$(X)$(", "expansion"

def pods(tessera, args):
    """(pod 0's DNS name, the Job spec) of `tessera k8s render ARGS`, named as Kubernetes names
    them (Indexed Job + headless Service, or JobSet)."""
    docs = json.loads(subprocess.run([tessera, "k8s", "render", "--format", "json"] + args,
                                     capture_output=True, check=True).stdout)["items"]
    kinds = [d["kind"] for d in docs]
    if kinds == ["JobSet"]:
        js = docs[0]
        assert js["spec"]["network"]["enableDNSHostnames"] is True
        rjob = js["spec"]["replicatedJobs"][0]
        assert rjob["replicas"] == 1
        subdomain = js["spec"]["network"].get("subdomain", js["metadata"]["name"])
        # JobSet pod hostnames: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>
        host0 = f"{js['metadata']['name']}-{rjob['name']}-0-0.{subdomain}"
        return host0, rjob["template"]["spec"]
    assert kinds == ["Service", "Job"], kinds
    service, job = docs
    spec = job["spec"]
    pod = spec["template"]["spec"]
    # A headless Service selecting the Job's pods (the Job controller labels them with
    # batch.kubernetes.io/job-name) named as the pods' subdomain: pod I is <job>-<I>.<subdomain>.
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert pod["subdomain"] == service["metadata"]["name"]
    return f"{job['metadata']['name']}-0.{pod['subdomain']}", spec


def pod_argv(spec, index):
    """(env, argv) of pod `index` of a Job spec: the downward-API completion index and
    plain values in the container's env, $(VAR) expanded in command and args."""
    container = spec["template"]["spec"]["containers"][0]
    env = {}
    for var in container.get("env", []):
        if var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == INDEX:
            env[var["name"]] = str(index)  # the Job controller's annotation on pod I
        elif "value" in var:
            env[var["name"]] = expand(var["value"], env)
    return env, [expand(a, env) for a in container["command"] + container.get("args", [])]
