/* Method specifications: parsing, canonical text and clear errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "core/method.h"
#include "vspec/plugin.h"

static void test_parse(void **state) {
  (void)state;
  vs_method m;
  char err[256];
  assert_int_equal(vs_method_parse(" ar ", &m, err, sizeof err), 0);
  assert_int_equal(m.kind, VS_METHOD_AR);
  assert_int_equal(vs_method_parse("sd:lantern:k=100,delta=0.2", &m, err, sizeof err), 0);
  assert_int_equal(m.kind, VS_METHOD_SD);
  assert_string_equal(m.rule, "lantern");
  assert_string_equal(m.rule_params, "k=100,delta=0.2");
  assert_string_equal(m.sched, "standard");
  assert_string_equal(m.text, "sd:lantern:k=100,delta=0.2@standard");
  assert_int_equal(vs_method_parse("sd:exact@vvs:skip=uniform", &m, err, sizeof err), 0);
  assert_string_equal(m.sched, "vvs");
  assert_string_equal(m.sched_params, "skip=uniform");
  vs_method many[4];
  assert_int_equal(vs_method_split("ar; sd:exact ;;sd:coolsd:delta=2", many, 4, err, sizeof err), 3);
  assert_string_equal(many[2].rule_params, "delta=2");
  /* the drafter's own parameters are written among the scheduler's and handed to it alone */
  assert_int_equal(vs_method_parse("sd:exact@standard:drafter=jacobi,coupling=gumbel,depth=7,"
                                   "init=random", &m, err, sizeof err), 0);
  assert_string_equal(m.sched_params, "drafter=jacobi,depth=7");
  assert_string_equal(m.drafter_params, "coupling=gumbel,init=random");
  assert_string_equal(m.text, "sd:exact@standard:drafter=jacobi,coupling=gumbel,depth=7,init=random");
  assert_int_equal(vs_method_drafter(&m), VSPEC_DRAFTER_PLUGIN);
  assert_string_equal(m.drafter, "jacobi");
  char text[sizeof m.text];
  vs_method_compose(&m, "drafter=jacobi,depth=3", text, sizeof text);
  assert_string_equal(text, "sd:exact@standard:drafter=jacobi,depth=3,coupling=gumbel,init=random");
  /* another drafter plugin's parameters are written drafter.KEY */
  assert_int_equal(vs_method_parse("sd:exact@standard:drafter=mine,drafter.width=3,depth=2", &m,
                                   err, sizeof err), 0);
  assert_string_equal(m.sched_params, "drafter=mine,depth=2");
  assert_string_equal(m.drafter_params, "width=3");
  vs_method_compose(&m, m.sched_params, text, sizeof text);
  assert_string_equal(text, "sd:exact@standard:drafter=mine,depth=2,drafter.width=3");
  assert_int_equal(vs_method_drafter(&m), VSPEC_DRAFTER_PLUGIN);
  assert_int_equal(vs_method_parse("sd:exact@standard:coupling=maximal", &m, err, sizeof err), 0);
  assert_string_equal(m.sched_params, "");
  vs_method_compose(&m, "", text, sizeof text);
  assert_string_equal(text, "sd:exact@standard:coupling=maximal");
  assert_int_equal(vs_method_drafter(&m), VSPEC_DRAFTER_AUTO);
  assert_int_equal(vs_method_parse("sd:exact@standard:drafter=head", &m, err, sizeof err), 0);
  assert_int_equal(vs_method_drafter(&m), VSPEC_DRAFTER_HEAD);
}

static void test_errors(void **state) {
  (void)state;
  vs_method m, many[2];
  char err[256];
  assert_int_equal(vs_method_parse("warp", &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "'warp'"));
  assert_int_equal(vs_method_parse("sd:", &m, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_method_parse("sd:Exact", &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "Exact"));
  /* never silently truncated: a too-long parameter list is an error */
  char longm[1000] = "sd:exact@standard:";
  while (strlen(longm) < 600) strcat(longm, "depth=1,");
  strcat(longm, "depth=12");
  assert_int_equal(vs_method_parse(longm, &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "too long"));
  /* a method's bytes are echoed escaped, never as they came (issue 12, item 7) */
  assert_int_equal(vs_method_parse("sd:ex\x1b[2J", &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "\\x1b"));
  assert_null(strchr(err, 0x1b));
  assert_int_equal(vs_method_parse("w\xffrp", &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "'w\\xffrp' has \\xff at offset 1"));
  assert_int_equal(vs_method_parse("sd:exact@std\r\nforged", &m, err, sizeof err), VSPEC_EINVAL);
  assert_null(strchr(err, '\n'));
  assert_int_equal(vs_method_split("ar; sd:ex\x7f", many, 2, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "\\x7f"));
  assert_int_equal(vs_method_split("ar;ar;ar", many, 2, err, sizeof err), VSPEC_ERANGE);
  assert_int_equal(vs_method_split(" ; ", many, 2, err, sizeof err), VSPEC_EINVAL);
}

/* Two methods alike in every field. */
static void same_method(const vs_method *a, const vs_method *b) {
  assert_int_equal(a->kind, b->kind);
  assert_int_equal(a->size, b->size);
  assert_string_equal(a->rule, b->rule);
  assert_string_equal(a->rule_params, b->rule_params);
  assert_string_equal(a->sched, b->sched);
  assert_string_equal(a->sched_params, b->sched_params);
  assert_string_equal(a->drafter, b->drafter);
  assert_string_equal(a->drafter_params, b->drafter_params);
  assert_string_equal(a->text, b->text);
}

/* size=auto is a field, kept out of the scheduler's parameters (and the only size value). */
static void test_size(void **state) {
  (void)state;
  vs_method m;
  char err[256];
  assert_int_equal(vs_method_parse("sd:exact@standard:shape=chain, size = auto,drafter=jacobi,"
                                   "coupling=maximal", &m, err, sizeof err), 0);
  assert_int_equal(m.size, VS_METHOD_SIZE_AUTO);
  assert_string_equal(m.sched_params, "shape=chain,drafter=jacobi");
  assert_string_equal(m.drafter_params, "coupling=maximal");
  assert_string_equal(m.text, "sd:exact@standard:shape=chain, size = auto,drafter=jacobi,"
                              "coupling=maximal");
  assert_int_equal(vs_method_parse("sd:exact@standard:depth=3", &m, err, sizeof err), 0);
  assert_int_equal(m.size, VS_METHOD_SIZE_FIXED);
  assert_int_equal(vs_method_parse("sd:exact@standard:size=7", &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "size=7: only size=auto"));
  /* a drafter plugin's own size is its own */
  assert_int_equal(vs_method_parse("sd:exact@standard:drafter=mine,drafter.size=7", &m, err,
                                   sizeof err), 0);
  assert_string_equal(m.drafter_params, "size=7");
  assert_int_equal(vs_method_parse("ar", &m, err, sizeof err), 0);
  vs_method ar;
  vs_method_set_ar(&ar);
  same_method(&m, &ar);
}

/* Submit's accept/sched form makes the method that parsing its spelling makes. */
static void test_make(void **state) {
  (void)state;
  static const char *const parts[][5] = {
      /* rule, rule params, sched, sched params, the same method spelled */
      {"lantern", "delta=0.2", NULL, NULL, "sd:lantern:delta=0.2"},
      {"lantern", " k=100,delta=0.2 ", "standard", "shape=dynamic,top_k=4,size=auto",
       "sd:lantern:k=100,delta=0.2@standard:shape=dynamic,top_k=4,size=auto"},
      {"exact", "", "vvs", "drafter=head,shape=chain,depth=4",
       "sd:exact@vvs:drafter=head,shape=chain,depth=4"},
      {"exact", NULL, "", "drafter=jacobi,coupling=maximal,depth=7",
       "sd:exact@standard:drafter=jacobi,coupling=maximal,depth=7"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    vs_method made, parsed;
    assert_int_equal(vs_method_make(parts[i][0], parts[i][1], parts[i][2], parts[i][3], &made,
                                     err, sizeof err), 0);
    assert_int_equal(vs_method_parse(parts[i][4], &parsed, err, sizeof err), 0);
    same_method(&made, &parsed);
  }
  vs_method m;
  assert_int_equal(vs_method_make("Exact", "", NULL, NULL, &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "Exact"));
  assert_int_equal(vs_method_make("", "", NULL, NULL, &m, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "missing acceptance rule"));
  assert_int_equal(vs_method_make("exact", "", NULL, "size=3", &m, err, sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "only size=auto"));
}

/* The plugins' parameters are parsed with the method, once; the text is kept for printing. */
static void test_parameter_sets(void **state) {
  (void)state;
  vs_method m, made;
  char err[256], buf[512];
  assert_int_equal(vs_method_parse("sd:lantern: k = 100 ,delta=0.2@standard:size=auto,"
                                   "drafter=jacobi,coupling=gumbel,depth=3", &m, err, sizeof err),
                   0);
  assert_string_equal(vs_param_string(&m.rule_set, "k"), "100");
  assert_string_equal(vs_param_string(&m.rule_set, "delta"), "0.2");
  vs_params_format(&m.sched_set, buf, sizeof buf);
  assert_string_equal(buf, "drafter=jacobi,depth=3"); /* no size=auto, no drafter keys */
  vs_params_format(&m.drafter_set, buf, sizeof buf);
  assert_string_equal(buf, "coupling=gumbel");
  assert_string_equal(m.rule_params, "k = 100 ,delta=0.2"); /* printed as written */
  /* the parts' form gives the same sets; a copy is the method */
  assert_int_equal(vs_method_make("lantern", "k=100,delta=0.2", NULL,
                                  "size=auto,drafter=jacobi,coupling=gumbel,depth=3", &made, err,
                                  sizeof err), 0);
  vs_method copy = made;
  vs_params_format(&copy.sched_set, buf, sizeof buf);
  assert_string_equal(buf, "drafter=jacobi,depth=3");
  assert_string_equal(vs_param_string(&copy.drafter_set, "coupling"), "gumbel");
  assert_int_equal(vs_params_count(&copy.rule_set), 2);
  /* parameters that do not parse: told as the plugin's, as opening it said them */
  assert_int_equal(vs_method_parse("sd:lantern:k@standard", &m, err, sizeof err), VSPEC_EFORMAT);
  assert_string_equal(err, "acceptance rule 'lantern': parameter 'k' has no value "
                           "(expected key=value)");
  assert_int_equal(vs_method_parse("sd:exact@standard:depth=2,depth=3", &m, err, sizeof err),
                   VSPEC_EFORMAT);
  assert_string_equal(err, "scheduler 'standard': parameter 'depth' given twice");
  assert_int_equal(vs_method_make("exact", "", "standard", "drafter=jacobi,coupling=a=b", &m,
                                  err, sizeof err), VSPEC_EFORMAT);
  assert_non_null(strstr(err, "drafter 'jacobi': parameter 'coupling'"));
  assert_int_equal(vs_method_parse("sd:exact@standard:drafter.x=1,drafter.x=2", &m, err,
                                   sizeof err), VSPEC_EFORMAT);
  assert_string_equal(err, "drafter 'model': parameter 'x' given twice");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_parse), cmocka_unit_test(test_errors),
                                     cmocka_unit_test(test_size), cmocka_unit_test(test_make),
                                     cmocka_unit_test(test_parameter_sets)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
