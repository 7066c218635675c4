#include "engine/verifiers/math_answer.h"

#include "absl/numeric/int128.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace tandem::engine {
namespace {

// An exact rational; numbers too long for it compare as text instead.
struct Rational {
  absl::int128 numerator;
  absl::int128 denominator;  // > 0, coprime with the numerator.

  bool operator==(const Rational& other) const {
    return numerator == other.numerator && denominator == other.denominator;
  }
};

constexpr int kMaxDigits = 30;  // Keeps products of two parsed values inside 128 bits.

absl::int128 Gcd(absl::int128 a, absl::int128 b) {
  if (a < 0) a = -a;
  while (b != 0) {
    const absl::int128 rest = a % b;
    a = b;
    b = rest;
  }
  return a;
}

std::optional<Rational> Reduced(absl::int128 numerator, absl::int128 denominator) {
  if (denominator == 0) return std::nullopt;
  if (denominator < 0) {
    numerator = -numerator;
    denominator = -denominator;
  }
  const absl::int128 divisor = Gcd(numerator, denominator);
  if (divisor > 1) {
    numerator /= divisor;
    denominator /= divisor;
  }
  return Rational{numerator, denominator};
}

// "-12.50" -> -25/2. Digits with an optional sign and decimal point, nothing else.
std::optional<Rational> ParseDecimal(absl::string_view text) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  absl::int128 numerator = 0;
  absl::int128 denominator = 1;
  int digits = 0;
  bool after_point = false;
  for (char c : text) {
    if (c == '.' && !after_point) {
      after_point = true;
    } else if (absl::ascii_isdigit(c) && ++digits <= kMaxDigits) {
      numerator = numerator * 10 + (c - '0');
      if (after_point) denominator *= 10;
    } else {
      return std::nullopt;
    }
  }
  if (digits == 0 || digits > kMaxDigits) return std::nullopt;
  return Reduced(negative ? -numerator : numerator, denominator);
}

std::optional<Rational> Divide(std::optional<Rational> top, std::optional<Rational> bottom) {
  if (!top || !bottom || bottom->numerator == 0) return std::nullopt;
  return Reduced(top->numerator * bottom->denominator, top->denominator * bottom->numerator);
}

// The argument of a LaTeX command: "{...}" with nested braces, or one character ("\frac12").
std::optional<absl::string_view> TakeArgument(absl::string_view& text) {
  if (text.empty()) return std::nullopt;
  if (text[0] != '{') {
    absl::string_view argument = text.substr(0, 1);
    text.remove_prefix(1);
    return argument;
  }
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) {
      absl::string_view argument = text.substr(1, i - 1);
      text.remove_prefix(i + 1);
      return argument;
    }
  }
  return std::nullopt;
}

std::optional<Rational> ParseNumber(absl::string_view text);

// "\frac{a}{b}" (also \dfrac, \tfrac), with an optional sign before it.
std::optional<Rational> ParseLatexFraction(absl::string_view text) {
  bool negative = absl::ConsumePrefix(&text, "-");
  if (!absl::ConsumePrefix(&text, "\\frac") && !absl::ConsumePrefix(&text, "\\dfrac") &&
      !absl::ConsumePrefix(&text, "\\tfrac")) {
    return std::nullopt;
  }
  const auto top = TakeArgument(text);
  const auto bottom = TakeArgument(text);
  if (!top || !bottom || !text.empty()) return std::nullopt;
  auto value = Divide(ParseNumber(*top), ParseNumber(*bottom));
  if (value && negative) value->numerator = -value->numerator;
  return value;
}

std::optional<Rational> ParseNumber(absl::string_view text) {
  if (auto fraction = ParseLatexFraction(text)) return fraction;
  if (const size_t slash = text.find('/'); slash != absl::string_view::npos) {
    return Divide(ParseDecimal(text.substr(0, slash)), ParseDecimal(text.substr(slash + 1)));
  }
  return ParseDecimal(text);
}

// Unwraps "\text{...}" and "\mathrm{...}" to their content.
std::string UnwrapText(std::string text) {
  for (absl::string_view command : {"\\text", "\\mathrm", "\\textbf", "\\mbox"}) {
    for (size_t at; (at = text.find(command.data(), 0, command.size())) != std::string::npos;) {
      absl::string_view rest = absl::string_view(text).substr(at + command.size());
      const auto argument = TakeArgument(rest);
      if (!argument) break;
      text = std::string(text.substr(0, at)) + std::string(*argument) + std::string(rest);
    }
  }
  return text;
}

// The answer text with what never changes its meaning removed.
std::string Normalized(absl::string_view answer) {
  std::string text = UnwrapText(std::string(answer));
  text = absl::StrReplaceAll(text, {{" ", ""},
                                    {"\t", ""},
                                    {"\n", ""},
                                    {"\\!", ""},
                                    {"\\,", ""},
                                    {"\\;", ""},
                                    {"\\left", ""},
                                    {"\\right", ""},
                                    {"\\$", ""},
                                    {"$", ""},
                                    {"\\%", ""},
                                    {"%", ""},
                                    {"\xE2\x88\x92", "-"},  // U+2212 MINUS SIGN
                                    {"\\dfrac", "\\frac"},
                                    {"\\tfrac", "\\frac"}});
  absl::string_view trimmed = text;
  while (absl::ConsumeSuffix(&trimmed, ".")) {
  }
  return std::string(trimmed);
}

// A comma between digit groups ("1,234,567") separates thousands; other commas (tuples,
// intervals) are part of the answer.
bool IsThousandsSeparator(absl::string_view text, size_t i) {
  if (text[i] != ',' || i == 0 || !absl::ascii_isdigit(text[i - 1]) || i + 3 >= text.size()) {
    return false;
  }
  for (size_t k = i + 1; k <= i + 3; ++k) {
    if (!absl::ascii_isdigit(text[k])) return false;
  }
  return i + 4 == text.size() || !absl::ascii_isdigit(text[i + 4]);
}

std::string WithoutThousandsSeparators(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!IsThousandsSeparator(text, i)) out.push_back(text[i]);
  }
  return out;
}

std::optional<size_t> LastCommand(absl::string_view text, absl::string_view command) {
  const size_t at = text.rfind(command);
  if (at == absl::string_view::npos) return std::nullopt;
  return at + command.size();
}

}  // namespace

std::optional<std::string> FinalAnswer(absl::string_view solution) {
  std::optional<size_t> boxed = LastCommand(solution, "\\boxed");
  const std::optional<size_t> fbox = LastCommand(solution, "\\fbox");
  if (!boxed || (fbox && *fbox > *boxed)) boxed = fbox;
  if (boxed) {
    absl::string_view rest = absl::StripLeadingAsciiWhitespace(solution.substr(*boxed));
    if (!rest.empty() && rest[0] == '{') {
      if (auto argument = TakeArgument(rest)) return std::string(*argument);
    }
  }
  if (const auto hashes = LastCommand(solution, "####")) {
    absl::string_view rest = solution.substr(*hashes);
    rest = rest.substr(0, rest.find('\n'));
    return std::string(absl::StripAsciiWhitespace(rest));
  }
  return std::nullopt;
}

double MathReward(absl::string_view completion, absl::string_view reference) {
  const std::optional<std::string> answer = FinalAnswer(completion);
  if (!answer) return 0.0;
  const std::string expected = Normalized(FinalAnswer(reference).value_or(std::string(reference)));
  const std::string given = Normalized(*answer);
  const auto expected_value = ParseNumber(WithoutThousandsSeparators(expected));
  const auto given_value = ParseNumber(WithoutThousandsSeparators(given));
  if (expected_value && given_value) return *expected_value == *given_value ? 1.0 : 0.0;
  return !given.empty() && given == expected ? 1.0 : 0.0;
}

}  // namespace tandem::engine
