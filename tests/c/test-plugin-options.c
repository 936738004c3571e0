/* test-plugin-options.c — the options a plugin declares (plugin ABI 1.3):
 * declarations the loader refuses (each with the exact reason), the user's
 * plugin_options checked against good declarations (a table of bad values,
 * each with its exact sentence), defaults filled in, and the typed reads
 * the host services make of them. */
#include <jansson.h>

#include "harness.h"
#include "run/context.h"

static const char *const modes[] = {"fast", "safe", NULL};
#define OPT(...) {.struct_size = sizeof(ddplug_option), .abi_version = DDPLUG_PLUGIN_ABI_VERSION, __VA_ARGS__}
static const ddplug_option o_flag = OPT(.name = "flag", .type = DDPLUG_OPTION_BOOL,
                                        .default_json = "false", .description = "a switch");
static const ddplug_option o_size = OPT(.name = "size", .type = DDPLUG_OPTION_INT, .int_min = 64,
                                        .int_max = 4096, .int_multiple = 64,
                                        .default_json = "256", .description = "bytes");
static const ddplug_option o_ratio = OPT(.name = "ratio", .type = DDPLUG_OPTION_NUMBER,
                                         .num_min = 0, .num_max = 1, .description = "a share");
static const ddplug_option o_mode = OPT(.name = "mode", .type = DDPLUG_OPTION_STRING,
                                        .choices = modes, .default_json = "\"safe\"",
                                        .description = "how");
static const ddplug_option o_map = OPT(.name = "device_map", .type = DDPLUG_OPTION_INT_LIST,
                                       .int_min = 0, .int_max = 7, .max_items = 4,
                                       .description = "one per local rank");
static const ddplug_option *const good[] = {&o_flag, &o_size, &o_ratio, &o_mode, &o_map, NULL};

static ddplug_plugin table_with(const ddplug_option *const *options) {
  ddplug_plugin t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  t.name = "fake";
  t.options = options;
  return t;
}

TEST(given_and_default_values_read_back_typed) {
  ddplug_plugin t = table_with(good);
  json_t *v = NULL;
  CHECK_OK(ddplug__options_check(&t, "{\"flag\": true, \"ratio\": 0.25, \"device_map\": [3, 1]}", &v));
  const json_t *x;
  CHECK_OK(ddplug__option_value(&t, v, "flag", DDPLUG_OPTION_BOOL, &x));
  CHECK(json_is_true(x));
  CHECK_OK(ddplug__option_value(&t, v, "size", DDPLUG_OPTION_INT, &x)); /* the default */
  CHECK_EQ_INT(json_integer_value(x), 256);
  CHECK_OK(ddplug__option_value(&t, v, "ratio", DDPLUG_OPTION_NUMBER, &x));
  CHECK(json_number_value(x) == 0.25);
  CHECK_OK(ddplug__option_value(&t, v, "mode", DDPLUG_OPTION_STRING, &x));
  CHECK_EQ_STR(json_string_value(x), "safe");
  CHECK_OK(ddplug__option_value(&t, v, "device_map", DDPLUG_OPTION_INT_LIST, &x));
  CHECK_EQ_INT(json_array_size(x), 2);
  /* read with the wrong type, an undeclared name */
  CHECK_STATUS(ddplug__option_value(&t, v, "size", DDPLUG_OPTION_STRING, &x),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "plugin option 'size' is declared as an integer, not read as a string");
  CHECK_STATUS(ddplug__option_value(&t, v, "sise", DDPLUG_OPTION_INT, &x), DDPLUG_E_NOT_FOUND);
  json_decref(v);
  /* no default, not given */
  CHECK_OK(ddplug__options_check(&t, "{}", &v));
  CHECK_STATUS(ddplug__option_value(&t, v, "ratio", DDPLUG_OPTION_NUMBER, &x), DDPLUG_E_NOT_FOUND);
  CHECK_CONTAINS(ddplug_last_error(), "plugin option 'ratio' is not set and has no default");
  json_decref(v);
  /* a plugin that declares nothing reads options_json itself */
  ddplug_plugin none = table_with(NULL);
  CHECK_OK(ddplug__options_check(&none, "{\"anything\": 1}", &v));
  CHECK(v == NULL);
}

TEST(bad_values_name_the_key) {
  static const struct {
    const char *json, *error;
  } bad[] = {
      {"{\"sise\": 128}",
       "plugin_options.sise: plugin fake has no such option (did you mean 'size'? its options: "
       "flag, size, ratio, mode, device_map)"},
      {"{\"zzz\": 1}",
       "plugin_options.zzz: plugin fake has no such option (its options: flag, size, ratio, mode, "
       "device_map)"},
      {"{\"flag\": 1}", "plugin_options.flag: expected true or false, got 1"},
      {"{\"size\": \"64\"}",
       "plugin_options.size: expected an integer in 64..4096, a multiple of 64, got \"64\""},
      {"{\"size\": 8192}", "plugin_options.size: 8192 is out of range 64..4096"},
      {"{\"size\": 100}", "plugin_options.size: 100 is not a multiple of 64"},
      {"{\"ratio\": 1.5}", "plugin_options.ratio: 1.5 is out of range 0..1"},
      {"{\"ratio\": \"half\"}", "plugin_options.ratio: expected a number, got \"half\""},
      {"{\"mode\": \"fasst\"}",
       "plugin_options.mode: \"fasst\" is not one of \"fast\", \"safe\" (did you mean \"fast\"?)"},
      {"{\"mode\": 3}", "plugin_options.mode: expected a string, got 3"},
      {"{\"device_map\": []}", "plugin_options.device_map: expected an array of 1..4 integers, got an array"},
      {"{\"device_map\": [0, 1, 2, 3, 4]}",
       "plugin_options.device_map: expected an array of 1..4 integers, got an array"},
      {"{\"device_map\": [0, 9]}", "plugin_options.device_map[1]: 9 is out of range 0..7"},
      {"{\"device_map\": [0, true]}",
       "plugin_options.device_map[1]: expected an integer in 0..7, got true"},
  };
  ddplug_plugin t = table_with(good);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *v = (json_t *)1;
    CHECK_STATUS(ddplug__options_check(&t, bad[i].json, &v), DDPLUG_E_CONFIG);
    CHECK(v == NULL);
    CHECK_MSG(!strcmp(ddplug_last_error(), bad[i].error), "%s:\n   got  '%s'\n   want '%s'",
              bad[i].json, ddplug_last_error(), bad[i].error);
  }
  /* an empty declaration list: no options at all */
  static const ddplug_option *const nothing[] = {NULL};
  ddplug_plugin t0 = table_with(nothing);
  json_t *v = NULL;
  CHECK_STATUS(ddplug__options_check(&t0, "{\"x\": 1}", &v), DDPLUG_E_CONFIG);
  CHECK_EQ_STR(ddplug_last_error(), "plugin_options.x: plugin fake takes no options");
}

TEST(declarations_the_loader_refuses) {
  static const ddplug_option bad_name = OPT(.name = "Chunk", .type = DDPLUG_OPTION_INT,
                                            .description = "x"),
                             bad_type = OPT(.name = "t", .type = 9, .description = "x"),
                             bad_range = OPT(.name = "r", .type = DDPLUG_OPTION_INT, .int_min = 5,
                                             .int_max = 1, .description = "x"),
                             bad_json = OPT(.name = "j", .type = DDPLUG_OPTION_INT,
                                            .default_json = "12,", .description = "x"),
                             bad_default = OPT(.name = "d", .type = DDPLUG_OPTION_INT, .int_min = 1,
                                               .int_max = 4, .default_json = "8", .description = "x"),
                             too_small = {.struct_size = 8, .name = "s"};
  static const ddplug_option *const l_name[] = {&bad_name, NULL}, *const l_type[] = {&bad_type, NULL},
                                    *const l_range[] = {&bad_range, NULL},
                                    *const l_json[] = {&bad_json, NULL},
                                    *const l_default[] = {&o_flag, &bad_default, NULL},
                                    *const l_twice[] = {&o_flag, &o_size, &o_flag, NULL},
                                    *const l_small[] = {&too_small, NULL};
  static const struct {
    const ddplug_option *const *list;
    const char *error;
  } cases[] = {
      {l_name, "option #0 'Chunk' is declared wrongly: the name must be 1 to 63 characters of a-z, 0-9 and '_'"},
      {l_type, "option #0 't' is declared wrongly: the type is not a ddplug_option_type"},
      {l_range, "option #0 'r' is declared wrongly: its minimum is above its maximum"},
      {l_json, "option #0 'j' is declared wrongly: its default '12,' is not JSON"},
      {l_default,
       "option #1 'd' is declared wrongly: its default does not pass its own rules "
       "(plugin_options.d: 8 is out of range 1..4)"},
      {l_twice, "option #2 'flag' is declared wrongly: the name is declared twice"},
      {l_small, "option #0 's' is declared wrongly: its struct_size is smaller than an ABI 1.3 ddplug_option"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ddplug_plugin t = table_with(cases[i].list);
    CHECK_STATUS(ddplug__options_validate_decls(&t, "/x/libddplug-fake.so"), DDPLUG_E_INVALID_ARGUMENT);
    CHECK_CONTAINS(ddplug_last_error(), "plugin 'fake' (/x/libddplug-fake.so): ");
    CHECK_CONTAINS(ddplug_last_error(), cases[i].error);
  }
  ddplug_plugin ok = table_with(good);
  CHECK_OK(ddplug__options_validate_decls(&ok, "/x/libddplug-fake.so"));
}
