"""torch.compile's half of the comparison (bench/compare.sh): the workloads of
bench/compare_warden.cc through Dynamo + Inductor (CPU, default mode, automatic dynamic shapes)
and through eager PyTorch, in one process. Prints one JSON object per line, like the C++ half:
{"workload", "system": "eager-py" | "torch.compile", "us": median µs per call, "compiles"}.
"""
import json
import math
import sys
import time

import torch
import torch._dynamo
from torch._dynamo.utils import counters


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def time_us(call, iters, reps=7, warm=3):
    for _ in range(warm):
        call()
    us = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        us.append((time.perf_counter() - t0) * 1e6 / iters)
    return median(us)


def emit(workload, system, us, compiles):
    print(json.dumps({"workload": workload, "system": system, "us": round(us, 4), "compiles": compiles}), flush=True)


def fresh(fn):
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(fn)


def graphs():
    return int(counters["stats"]["unique_graphs"])


def same(a, b):
    return all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(a, b))


def compare(name, fn, args, iters):
    want = fn(*args)
    emit(name, "eager-py", time_us(lambda: fn(*args), iters), 0)
    f = fresh(fn)
    if not same(f(*args), want):
        sys.exit("torch_compile_compare: %s differs from eager" % name)
    emit(name, "torch.compile", time_us(lambda: f(*args), iters), graphs())


def sweep(name, fn, calls):
    f = fresh(fn)
    t0 = time.perf_counter()
    for a in calls:
        if not same(f(*a), fn(*a)):
            sys.exit("torch_compile_compare: %s differs from eager" % name)
    emit(name, "torch.compile", (time.perf_counter() - t0) * 1e6 / len(calls), graphs())


def chain10(x, w):  # bench/workloads.h Chain10
    y = x * w
    y = y + x
    y = torch.tanh(y)
    y = y - w
    y = torch.relu(y)
    y = torch.sigmoid(y)
    y = torch.exp(y)
    y = y * 0.5
    y = torch.add(y, x, alpha=2)
    return (-y,)


class MlpAttention:  # bench/workloads.h MlpAttention
    def __init__(self, d, mult=4):
        s = 1.0 / math.sqrt(d)
        self.d = d
        self.w1 = torch.randn(mult * d, d) * s
        self.b1 = torch.randn(mult * d) * 0.1
        self.w2 = torch.randn(d, mult * d) * (s / math.sqrt(mult))
        self.b2 = torch.randn(d) * 0.1
        self.wq, self.wk, self.wv = (torch.randn(d, d) * s for _ in range(3))
        self.ln_w = 1 + torch.randn(d) * 0.1
        self.ln_b = torch.randn(d) * 0.1

    def __call__(self, x):
        F = torch.nn.functional
        h = F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2, self.b2)
        q, k, v = F.linear(h, self.wq), F.linear(h, self.wk), F.linear(h, self.wv)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d)
        attn = torch.matmul(torch.softmax(scores, -1), v)
        return (F.layer_norm(attn + h, (self.d,), self.ln_w, self.ln_b),)


class Cnn(torch.nn.Module):  # compare_warden.cc Cnn
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.b1 = torch.nn.BatchNorm2d(16)
        self.b2 = torch.nn.BatchNorm2d(32)
        self.fc = torch.nn.Linear(32 * 7 * 7, 10)
        self.eval()

    def forward(self, x):
        F = torch.nn.functional
        h = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        h = F.max_pool2d(F.relu(self.b2(self.c2(h))), 2)
        return (self.fc(h.flatten(1)),)


def radon_data(n=919, counties=85, seed=20261202):  # bench/radon.h MakeRadonData
    gen = torch.Generator().manual_seed(seed)
    first = torch.arange(counties)
    rest = torch.randint(counties, (n - counties,), generator=gen)
    county = torch.cat([first, rest])
    floor = torch.bernoulli(torch.full((n,), 0.2, dtype=torch.float64), generator=gen)
    a = 1.5 + 0.3 * torch.randn(counties, generator=gen, dtype=torch.float64)
    y = a.index_select(0, county) - 0.7 * floor + 0.75 * torch.randn(n, generator=gen, dtype=torch.float64)
    return county, floor, y, counties


def radon_theta(counties):
    v = [1.4, math.log(0.35)] + [1.4 + 0.01 * (j % 17 - 8) for j in range(counties)] + [-0.6, math.log(0.8)]
    return torch.tensor(v, dtype=torch.float64)


def make_radon_logp(data):
    county, floor, y, j = data
    half_log_2pi = 0.5 * math.log(2 * math.pi)

    def normal_t(x, mu, sigma):
        z = (x - mu) / sigma
        return -0.5 * z * z - torch.log(sigma) - half_log_2pi

    def normal_c(x, mu, sigma):
        z = (x - mu) / sigma
        return -0.5 * z * z + (-math.log(sigma) - half_log_2pi)

    def half_normal_of_log(log_x, scale):
        c = 0.5 * math.log(2 / math.pi) - math.log(scale)
        x = torch.exp(log_x)
        return c - 0.5 * (x / scale) * (x / scale) + log_x

    def logp(theta):
        mu_a, log_sigma_a, a = theta[0], theta[1], theta.narrow(0, 2, j)
        beta, log_sigma_y = theta[j + 2], theta[j + 3]
        sigma_a, sigma_y = torch.exp(log_sigma_a), torch.exp(log_sigma_y)
        lp = normal_c(mu_a, 0.0, 10.0)
        lp = lp + half_normal_of_log(log_sigma_a, 5.0)
        lp = lp + normal_t(a, mu_a, sigma_a).sum()
        lp = lp + normal_c(beta, 0.0, 10.0)
        lp = lp + half_normal_of_log(log_sigma_y, 5.0)
        mean = a.index_select(0, county) + beta * floor
        return (lp + normal_t(y, mean, sigma_y).sum(),)

    return logp


def main():
    print("torch_compile_compare: torch %s" % torch.__version__, file=sys.stderr)
    torch.manual_seed(0)
    with torch.inference_mode():
        for n in (1, 4, 16, 64):
            args = [torch.randn(1) for _ in range(n)]

            def add1(*a):
                return tuple(t + 1 for t in a)

            compare("overhead/args=%d" % n, add1, args, 2000 if n >= 16 else 20000)
        compare("chain10/n=16", chain10, [torch.randn(16), torch.randn(16)], 20000)
        compare("chain10/n=65536", chain10, [torch.randn(65536), torch.randn(65536)], 500)
        block = MlpAttention(64)
        compare("attention/b=1,L=16,d=64", block, [torch.randn(1, 16, 64)], 2000)
        cnn = Cnn()
        compare("cnn/b=8,28x28", cnn, [torch.randn(8, 1, 28, 28)], 200)
        data = radon_data()
        logp = make_radon_logp(data)
        compare("radon/logp", logp, [radon_theta(data[3])], 5000)
        lengths = [2 ** i for i in range(10)] + [3, 17, 100, 300, 511]
        sweep("sweep/attention L=1..512 (15 lengths)", block, [[torch.randn(1, L, 64)] for L in lengths])
        sweep("sweep/cnn batch=1..64 (8 sizes)", cnn, [[torch.randn(b, 1, 28, 28)] for b in (1, 2, 3, 4, 8, 16, 32, 64)])

    data = radon_data()
    logp = make_radon_logp(data)
    theta = radon_theta(data[3]).requires_grad_(True)

    def grad_of(f):
        return torch.autograd.grad(f(theta)[0], theta)[0]

    want = grad_of(logp)
    emit("radon/logp+grad", "eager-py", time_us(lambda: grad_of(logp), 2000), 0)
    f = fresh(logp)
    if not torch.allclose(grad_of(f), want, rtol=1e-6, atol=1e-8):
        sys.exit("torch_compile_compare: radon gradient differs from eager")
    emit("radon/logp+grad", "torch.compile", time_us(lambda: grad_of(f), 2000), graphs())


if __name__ == "__main__":
    main()
