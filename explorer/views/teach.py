"""How it works: the paper's equations, filled in with the numbers of the current step."""

from __future__ import annotations

import streamlit as st

from sat_core.decoding import DecodeSession, StepView
from sat_core.alpha import alpha_summary, doubly_stochastic

from explorer import stepping
from explorer.components.text import draw_caption
from explorer.guards import need_image, need_model
from explorer.state import context


def _tex_word(word: str) -> str:
    if word.startswith("<") and word.endswith(">"):  # <end>, <unk>: angle brackets outside text mode
        return r"\langle\text{" + word[1:-1] + r"}\rangle"
    return r"\text{“" + word + r"”}"


def draw_attention(view: StepView, t: int) -> None:
    s = alpha_summary(view.alpha)
    gh, gw = view.alpha.shape
    st.subheader("1 · Attention: where to look")
    st.markdown("Every region's annotation vector a_i is scored against the previous hidden state; "
                "a softmax over the L regions gives the weights α_t.")
    st.latex(r"e_{ti} = f_{\mathrm{att}}(a_i, h_{t-1}), \qquad \alpha_{ti} = \frac{\exp(e_{ti})}{\sum_{k=1}^{L} \exp(e_{tk})}")
    st.latex(rf"t = {t}:\quad \max_i \alpha_{{ti}} = {s.max:.3f} \text{{ at row {s.argmax[0]}, col {s.argmax[1]}}},"
             rf"\quad L = {gh} \times {gw} = {gh * gw}, \quad \text{{uniform}} = {1 / (gh * gw):.4f}")
    st.latex(rf"H(\alpha_t) = {s.entropy:.2f}\ \text{{nats}} \;\Rightarrow\; e^{{H}} = {s.effective_regions:.1f}"
             r"\ \text{regions effectively attended}")


def draw_context(view: StepView, t: int, hard: bool) -> None:
    st.subheader("2 · Context: what is seen")
    if hard:
        st.markdown("Hard attention picks **one** region: the location s_t is sampled with probabilities α_t "
                    "(at test time the expectation, i.e. the soft context, is used unless sampling is on).")
        st.latex(r"p(s_{t,i} = 1 \mid s_{<t}, a) = \alpha_{t,i}, \qquad \hat z_t = \sum_i s_{t,i}\, a_i")
        r, c = divmod(view.location, view.alpha.shape[1]) if view.location >= 0 else (-1, -1)
        st.latex(rf"t = {t}:\quad s_t = \text{{row {r}, col {c}}},\quad \alpha_{{t,s_t}} = "
                 rf"{float(view.alpha.reshape(-1)[view.location]) if view.location >= 0 else 0.0:.3f}")
    st.markdown("Soft attention blends all regions by α_t, scaled by the gate β_t, which lets the decoder "
                "lean on its language model instead of the image.")
    st.latex(r"\hat z_t = \beta_t \sum_{i=1}^{L} \alpha_{ti}\, a_i, \qquad \beta_t = \sigma\!\left(f_\beta(h_{t-1})\right)")
    st.latex(rf"t = {t}:\quad \beta_t = {view.beta:.3f}")


def draw_output(view: StepView, t: int) -> None:
    st.subheader("3 · Output: which word")
    st.markdown("The LSTM reads the previous word, its state and the context; the deep output layer turns "
                "its new state into a distribution over the vocabulary.")
    st.latex(r"i_t, f_t, o_t = \sigma(\cdot),\; g_t = \tanh(\cdot),\quad c_t = f_t \odot c_{t-1} + i_t \odot g_t,"
             r"\quad h_t = o_t \odot \tanh(c_t)")
    st.latex(r"p(y_t \mid a, y_{<t}) \propto \exp\!\big(L_o(E y_{t-1} + L_h h_t + L_z \hat z_t)\big)")
    terms = r",\quad ".join(rf"p({_tex_word(w)}) = {p:.3f}" for w, p in zip(view.top_words[:4], view.top_probs[:4]))
    st.latex(rf"t = {t}:\quad {terms}")
    st.latex(rf"\text{{chosen}}: {_tex_word(view.word)},\quad \log p = {view.logprob:.3f}"
             + (r"\ \text{(forced)}" if view.forced else ""))


def draw_penalty(session: DecodeSession) -> None:
    st.subheader("4 · Training signal: look everywhere once")
    alphas = session.alphas  # (T, L)
    st.markdown("Soft attention is trained with the doubly stochastic penalty, which pushes every region to "
                "receive about one unit of attention over the whole caption.")
    st.latex(r"L_d = -\log p(y \mid a) + \lambda \sum_{i=1}^{L} \Big(1 - \sum_t \alpha_{ti}\Big)^2")
    st.latex(rf"\text{{over the {len(alphas)} steps so far}}:\quad \sum_i \Big(1 - \sum_t \alpha_{{ti}}\Big)^2 = "
             rf"{float(doubly_stochastic(alphas)):.2f}")


def main() -> None:
    st.title("How it works")
    ctx = context()
    loaded = need_model(ctx)
    need_image(ctx)
    session, error = stepping.current_session(ctx)
    if error:
        st.error(error)
    view = session.steps[-1]
    t = view.index + 1
    c1, c2, c3 = st.columns([1, 1, 4])
    c1.button("◀ Back", key="teach_back", on_click=stepping.back, disabled=t <= 1)
    c2.button("Next ▶", key="teach_next", on_click=stepping.next_step, disabled=session.done)
    with c3:
        draw_caption([s.word for s in session.steps], t - 1, {s.index for s in session.steps if s.forced},
                     prefix=f"**Step {t}:** ")
    st.caption("The numbers below are those of the current step of *Step through* (same image, same model).")
    draw_attention(view, t)
    draw_context(view, t, loaded.model.hard)
    draw_output(view, t)
    draw_penalty(session)


main()
