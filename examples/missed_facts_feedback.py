"""A feedback kind that shows the reflector only which facts the memory missed."""

from collections import Counter

from evolve.feedback import Feedback, FeedbackKind, register_feedback_kind


class MissedFactsFeedback(FeedbackKind):
    """One line per fact the memory did not hold when asked, most often missed first: no
    questions, no answers. The failures it names go along as data, so `list_edit` (which
    reads failures, not text) works with it as with `diagnostic`."""

    name = "missed_facts"

    def render(self, questions, *, component, max_failures, max_chars, rng):
        failures = [q for q in questions if not q.correct and q.missing_facts()]
        missed = Counter(fact for q in failures for fact in q.missing_facts())
        named = [fact for fact, _ in missed.most_common(max_failures)]
        if named:
            lines = [f"- {fact}: missing in {missed[fact]} wrong answer(s)" for fact in named]
            text = "Facts the memory did not hold when asked:\n" + "\n".join(lines)
        else:
            text = "The memory held every fact the questions asked for."
        shown = tuple(q for q in failures if set(q.missing_facts()) & set(named))
        return Feedback(
            kind=self.name,
            text=text if max_chars is None else text[:max_chars],
            failures_shown=len(shown),
            failures_total=len(failures),
            items_total=len(questions),
            failures=shown,
        )


register_feedback_kind(MissedFactsFeedback)
