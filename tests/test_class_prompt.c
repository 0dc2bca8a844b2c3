/*
 * core/class_prompt.c: a prompt matched to a class of a class-conditional model, as vspecd
 * does for Submit.prompt (the HTTP front's prompt, `vspec generate --prompt`, the Python
 * client's prompt=): a number, a name in any case, a part of a '/' name, a name inside a
 * sentence (the longest one, plurals too), and the refusals: ambiguous, unknown (with the
 * classes and a likely slip), out of range, empty, a model without names or classes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/class_prompt.h"
#include "vspec/types.h"

static const char *const fmnist[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                     "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
/* a made-up model where one name holds another */
static const char *const boots[] = {"Boot", "Ankle boot", "Bag"};

static char err[1024];

static int pick(const char *const *names, int n, const char *prompt, vs_class_how *how) {
  vs_class_pick p = {-1, 0};
  err[0] = '\0';
  int rc = vs_class_prompt_match(prompt, "m", names, n, n, &p, err, sizeof err);
  if (rc) return -100 - rc;
  if (how) *how = p.how;
  return p.label;
}

static int fm(const char *prompt) { return pick(fmnist, 10, prompt, NULL); }

static void test_number_and_name(void **state) {
  vs_class_how how;
  assert_int_equal(pick(fmnist, 10, "7", &how), 7);
  assert_int_equal(how, VS_CLASS_BY_NUMBER);
  assert_int_equal(pick(fmnist, 10, " 0 ", &how), 0);
  assert_int_equal(pick(fmnist, 10, "sneaker", &how), 7);
  assert_int_equal(how, VS_CLASS_BY_NAME);
  assert_int_equal(fm("Sneaker"), 7);
  assert_int_equal(fm("ANKLE BOOT"), 9);
  assert_int_equal(fm("  bag\n"), 8);
  assert_int_equal(fm("t-shirt/top"), 0);
  assert_int_equal(fm("top"), 0); /* a part of a '/' name */
  assert_int_equal(fm("T-shirt"), 0);
}

static void test_in_a_sentence(void **state) {
  vs_class_how how;
  assert_int_equal(pick(fmnist, 10, "a photo of an ankle boot", &how), 9);
  assert_int_equal(how, VS_CLASS_IN_TEXT);
  assert_int_equal(fm("a pair of sneakers on a white background"), 7);
  assert_int_equal(fm("two dresses"), 3);
  assert_int_equal(fm("a red t-shirt"), 0); /* "shirt" lies inside "t-shirt" */
  assert_int_equal(fm("A SHIRT, folded"), 6);
  /* the longest contained name wins: "ankle boot" over "boot" */
  assert_int_equal(pick(boots, 3, "a photo of an ankle boot", NULL), 1);
  assert_int_equal(pick(boots, 3, "muddy boots", NULL), 0);
  assert_int_equal(pick(boots, 3, "boot", NULL), 0);
}

static void test_whole_words_only(void **state) {
  /* "coat" is inside "coating", "bag" inside "cabbage": neither names a class */
  assert_int_equal(fm("a coating of cabbage"), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "names no class of model 'm'"));
}

static void test_ambiguous(void **state) {
  assert_int_equal(fm("a shirt and a bag"), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "prompt: 'a shirt and a bag' names more than one class"));
  assert_non_null(strstr(err, "(Shirt, Bag)"));
  assert_non_null(strstr(err, "7 Sneaker")); /* the classes are listed */
  assert_int_equal(pick(boots, 3, "an ankle boot beside a boot", NULL), -100 - VSPEC_EINVAL);
}

static void test_unknown(void **state) {
  assert_int_equal(fm("a red car"), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "prompt: 'a red car' names no class of model 'm' (classes: "
                              "0 T-shirt/top, 1 Trouser, 2 Pullover"));
  assert_non_null(strstr(err, "9 Ankle boot)"));
  assert_null(strstr(err, "did you mean"));
  /* a slip of a name, alone or in a sentence, is named */
  assert_int_equal(fm("snekaer"), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "; did you mean 'Sneaker'?"));
  assert_int_equal(fm("a photo of an ankel boot"), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "; did you mean 'Ankle boot'?"));
  assert_int_equal(fm("10"), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "prompt: class 10 is out of range: model 'm' has classes 0..9"));
  assert_int_equal(fm("   "), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "prompt: empty"));
}

/* ImageNet's two cranes (tools/imagenet_classes.txt): the qualifier in parentheses tells them
 * apart, the name without it names both */
static const char *const cranes[] = {"crane (bird)", "crane (machine)", "Bag"};

static void test_qualified_names(void **state) {
  vs_class_how how;
  assert_int_equal(pick(cranes, 3, "Crane (Machine)", &how), 1);
  assert_int_equal(how, VS_CLASS_BY_NAME);
  assert_int_equal(pick(cranes, 3, "a crane (bird) on one leg", NULL), 0);
  assert_int_equal(pick(cranes, 3, "crane", NULL), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "'crane' names more than one class of model 'm' (crane (bird), "
                              "crane (machine)): name one"));
  assert_int_equal(pick(cranes, 3, "two cranes", NULL), -100 - VSPEC_EINVAL);
  assert_non_null(strstr(err, "(crane (bird), crane (machine))"));
}

/* A list longer than the message (ImageNet's 1000 classes) is cut before the likely name. */
static void test_long_list(void **state) {
  vs_class_pick p;
  char small[120];
  assert_int_equal(vs_class_prompt_match("snekaer", "m", fmnist, 10, 10, &p, small, sizeof small),
                   VSPEC_EINVAL);
  printf("  %s\n", small);
  assert_string_equal(small, "prompt: 'snekaer' names no class of model 'm' (classes: "
                             "0 T-shirt/top, and 9 more); did you mean 'Sneaker'?");
}

static void test_models_without_names(void **state) {
  vs_class_pick p;
  assert_int_equal(vs_class_prompt_match("3", "micro", NULL, 0, 4, &p, err, sizeof err), 0);
  assert_int_equal(p.label, 3);
  assert_int_equal(vs_class_prompt_match("sneaker", "micro", NULL, 0, 4, &p, err, sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "(classes 0..3; this model names none)"));
  assert_int_equal(vs_class_prompt_match("a cat", "txt", NULL, 0, 0, &p, err, sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "prompt: model 'txt' is not class-conditional"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_number_and_name), cmocka_unit_test(test_in_a_sentence),
      cmocka_unit_test(test_whole_words_only), cmocka_unit_test(test_ambiguous),
      cmocka_unit_test(test_unknown),         cmocka_unit_test(test_qualified_names),
      cmocka_unit_test(test_long_list),       cmocka_unit_test(test_models_without_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
