// Status and Result: engine calls report failure with a message a user can act on.
// They never abort; internal invariants may assert, user input never reaches an assert.
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace latent {

// Concatenates anything streamable: str_cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

class Status {
 public:
  Status() = default;  // success
  static Status error(std::string message) { return Status(std::move(message)); }
  template <typename... Args>
  static Status errorf(Args&&... args) {
    return Status(str_cat(std::forward<Args>(args)...));
  }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

  // Prefixes context to a failure ("loading vae/: " + message); success stays success.
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    return Status(context + ": " + message_);
  }

 private:
  explicit Status(std::string m) : failed_(true), message_(std::move(m)) {}
  bool failed_ = false;
  std::string message_;
};

inline Status ok_status() { return Status(); }

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status::error("internal error: Result built from a success status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace latent

#define LATENT_CONCAT_INNER_(a, b) a##b
#define LATENT_CONCAT_(a, b) LATENT_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` failed.
#define LATENT_TRY(expr)                              \
  do {                                                \
    ::latent::Status latent_try_status_ = (expr);     \
    if (!latent_try_status_.ok()) return latent_try_status_; \
  } while (0)

// LATENT_ASSIGN_OR_RETURN(auto t, make_tensor(...)); declares/assigns or returns the error.
#define LATENT_ASSIGN_OR_RETURN(lhs, expr)                                     \
  auto LATENT_CONCAT_(latent_result_, __LINE__) = (expr);                      \
  if (!LATENT_CONCAT_(latent_result_, __LINE__).ok())                          \
    return LATENT_CONCAT_(latent_result_, __LINE__).status();                  \
  lhs = std::move(LATENT_CONCAT_(latent_result_, __LINE__)).value()
