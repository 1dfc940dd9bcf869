// The log-density of a radon-style hierarchical model, written as plain LibTorch code the way a
// PyMC-like sampler would evaluate it thousands of times per chain:
//
//   mu_a    ~ Normal(0, 10)
//   sigma_a ~ HalfNormal(5)            sampled as log_sigma_a (log transform + Jacobian)
//   a[j]    ~ Normal(mu_a, sigma_a)    j = 0 .. counties-1
//   beta    ~ Normal(0, 10)
//   sigma_y ~ HalfNormal(5)            sampled as log_sigma_y
//   y[i]    ~ Normal(a[county[i]] + beta * floor[i], sigma_y)
//
// The sampler's position is one flat float64 vector theta = [mu_a, log_sigma_a, a[0..J), beta,
// log_sigma_y] (J + 4 values), as samplers hand it over; the data (county index int64 [N], floor
// [N], log radon y [N]) are constants of the function, as a model's observed data are. The data are
// synthetic, drawn from the model itself with a fixed seed, with the real dataset's sizes: N = 919
// houses in J = 85 counties (Gelman & Hill's Minnesota radon data).
#ifndef WARDEN_BENCH_RADON_H_
#define WARDEN_BENCH_RADON_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace warden::bench {

struct RadonData {
  int64_t counties = 0;
  at::Tensor county;  // int64 [N], values in [0, counties)
  at::Tensor floor;   // float64 [N], 0 (basement) or 1 (first floor)
  at::Tensor y;       // float64 [N], log radon
};

// Synthetic data drawn from the model (mu_a 1.5, sigma_a 0.3, beta -0.7, sigma_y 0.75); every
// county gets at least one house. Uses its own generator, so the global seed is untouched.
inline RadonData MakeRadonData(int64_t n = 919, int64_t counties = 85, uint64_t seed = 20261202) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  RadonData d;
  d.counties = counties;
  const at::Tensor first = at::arange(counties, at::TensorOptions().dtype(at::kLong));
  const at::Tensor rest = at::randint(counties, {n - counties}, gen, at::TensorOptions().dtype(at::kLong));
  d.county = at::cat({first, rest});
  d.floor = at::bernoulli(at::full({n}, 0.2, f64), gen);
  const at::Tensor a = 1.5 + 0.3 * at::randn({counties}, gen, f64);
  d.y = a.index_select(0, d.county) - 0.7 * d.floor + 0.75 * at::randn({n}, gen, f64);
  return d;
}

inline int64_t RadonDims(const RadonData& d) { return d.counties + 4; }

// A point of the unconstrained space near the posterior's bulk (deterministic).
inline at::Tensor RadonTheta(const RadonData& d) {
  std::vector<double> v = {1.4, std::log(0.35)};
  for (int64_t j = 0; j < d.counties; ++j) v.push_back(1.4 + 0.01 * static_cast<double>(j % 17 - 8));
  v.push_back(-0.6);
  v.push_back(std::log(0.8));
  return torch::tensor(v, at::TensorOptions().dtype(at::kDouble));
}

// Elementwise log N(x | mu, sigma); sigma is a tensor (so a sampled scale) or broadcasts.
inline at::Tensor NormalLogpdf(const at::Tensor& x, const at::Tensor& mu, const at::Tensor& sigma) {
  const double half_log_2pi = 0.5 * std::log(2 * M_PI);
  const at::Tensor z = (x - mu) / sigma;
  return -0.5 * z * z - at::log(sigma) - half_log_2pi;
}

inline at::Tensor NormalLogpdf(const at::Tensor& x, double mu, double sigma) {
  const double c = -std::log(sigma) - 0.5 * std::log(2 * M_PI);
  const at::Tensor z = (x - mu) / sigma;
  return -0.5 * z * z + c;
}

// log HalfNormal(x | scale) for x >= 0, given log x: the density of x plus the log-Jacobian of
// x = exp(log_x), i.e. the density of the unconstrained coordinate log_x.
inline at::Tensor HalfNormalLogpdfOfLog(const at::Tensor& log_x, double scale) {
  const double c = 0.5 * std::log(2 / M_PI) - std::log(scale);
  const at::Tensor x = at::exp(log_x);
  return c - 0.5 * (x / scale) * (x / scale) + log_x;
}

// The joint log-density at theta (0-dim float64 tensor).
inline at::Tensor RadonLogp(const at::Tensor& theta, const RadonData& d) {
  const int64_t j = d.counties;
  const at::Tensor mu_a = theta.select(0, 0);
  const at::Tensor log_sigma_a = theta.select(0, 1);
  const at::Tensor a = theta.narrow(0, 2, j);
  const at::Tensor beta = theta.select(0, j + 2);
  const at::Tensor log_sigma_y = theta.select(0, j + 3);
  const at::Tensor sigma_a = at::exp(log_sigma_a);
  const at::Tensor sigma_y = at::exp(log_sigma_y);

  at::Tensor logp = NormalLogpdf(mu_a, 0.0, 10.0);
  logp = logp + HalfNormalLogpdfOfLog(log_sigma_a, 5.0);
  logp = logp + NormalLogpdf(a, mu_a, sigma_a).sum();
  logp = logp + NormalLogpdf(beta, 0.0, 10.0);
  logp = logp + HalfNormalLogpdfOfLog(log_sigma_y, 5.0);
  const at::Tensor mean = a.index_select(0, d.county) + beta * d.floor;  // gather + broadcast
  return logp + NormalLogpdf(d.y, mean, sigma_y).sum();
}

}  // namespace warden::bench

#endif  // WARDEN_BENCH_RADON_H_
