/*
 * core/class_prompt.h - a text prompt turned into a class of a class-conditional model.
 *
 * vspecd has no text encoder, but a model whose manifest names its classes ("class_names" of
 * vspec-model.json) can still be asked in words: the OpenAI-style HTTP front, `vspec generate
 * --prompt` and the Python client's prompt= all send the text as Submit.prompt and the daemon
 * matches it here, once, so that every client picks the same class for the same words.
 *
 * A prompt names a class when, letter case and surrounding blanks ignored, it is
 *   - a class number ("7"), 0..num_classes-1;
 *   - a class name ("sneaker"), or one part of a name written with '/' ("top" of
 *     "T-shirt/top"), or a name without the qualifier in parentheses at its end ("crane" of
 *     "crane (bird)": when "crane (machine)" is a class too, that names both: ambiguous);
 *   - a text containing names as whole words, an English plural 's'/'es' allowed ("a photo of
 *     two sneakers"): the longest contained name wins, and a shorter one counts only where it
 *     lies inside the longer one ("ankle boot" over "boot", "t-shirt" over "shirt"); names
 *     found apart ("a shirt and a bag") make the prompt ambiguous.
 * Anything else is refused with the model's classes and, when a word of the prompt is a
 * likely slip of one name (core/suggest.h), that name.
 */
#ifndef VS_CLASS_PROMPT_H
#define VS_CLASS_PROMPT_H

#include <stddef.h>

typedef enum vs_class_how {
  VS_CLASS_BY_NUMBER = 1, /* "7" */
  VS_CLASS_BY_NAME,       /* "sneaker", "Sneaker" */
  VS_CLASS_IN_TEXT,       /* "a photo of a sneaker" */
} vs_class_how;

typedef struct vs_class_pick {
  int label;
  vs_class_how how;
} vs_class_pick;

/* Matches prompt against the classes of model `model` (for messages): names[0..n_names)
 * (n_names is 0 or num_classes) and the numbers 0..num_classes-1. 0 with *pick, or
 * VSPEC_EINVAL with a message that starts "prompt: " and lists the classes. */
int vs_class_prompt_match(const char *prompt, const char *model, const char *const *names,
                          int n_names, int num_classes, vs_class_pick *pick, char *err,
                          size_t errlen);

#endif /* VS_CLASS_PROMPT_H */
