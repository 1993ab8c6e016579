"""How it works: the paper's equations, filled in with the numbers of the current step, beside the
image and its α map."""

from __future__ import annotations

import streamlit as st

from sat_core.evaluation.alpha import alpha_summary, doubly_stochastic
from sat_core.checkpoint import LoadedCheckpoint
from sat_core.config import HardAttentionConfig, OptimConfig
from sat_core.decoding import DecodeSession, StepView

from explorer import maps, stepping
from explorer.components import stepper
from explorer.components.figures import draw_alpha
from explorer.components.text import draw_caption
from explorer.guards import need_image, need_model
from explorer.resources import PreparedImage
from explorer.state import Context, context


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _tex_word(word: str) -> str:
    if word.startswith("<") and word.endswith(">"):  # <end>, <unk>: angle brackets outside text mode
        return r"\langle\text{" + word[1:-1] + r"}\rangle"
    return r"\text{“" + word + r"”}"


def dsa_lambda(loaded: LoadedCheckpoint) -> float | None:
    """λ of the doubly stochastic penalty this checkpoint was trained with (None when not recorded)."""
    return None if loaded.optim is None else loaded.optim.dsa_lambda


def draw_picture(ctx: Context, image: PreparedImage, session: DecodeSession, view: StepView, hard: bool) -> None:
    """The image the encoder saw and α of the current step (the sampled or argmax location for hard attention)."""
    st.image(image.crop, caption="The image (the square the encoder saw)", width="stretch")
    overlay = maps.overlays(image.crop, session.alphas, view.alpha.shape, ctx.maps)[-1]
    location = view.location if hard and view.location >= 0 else None
    scale = maps.colour_scale(image.crop.shape[0], session.alphas, view.alpha.shape, ctx.maps, t=view.index)
    draw_alpha(overlay, view.alpha, key="teach_alpha", location=location, scale=scale,
               location_label="sampled location s_t" if ctx.decode.hard_mode == "sample" else "argmax α",
               title=f"α at step {view.index + 1}: {view.word}")


def draw_attention(view: StepView, t: int, optim: OptimConfig | None = None) -> None:
    s = alpha_summary(view.alpha)
    gh, gw = view.alpha.shape
    st.subheader("1 · Attention: where to look")
    if optim is not None and optim.attention_lambda:
        st.info(f"This model's α was also trained towards the object each word names (supervised attention, "
                f"λ_a = {optim.attention_lambda:g}: the cross-entropy from the object's cells to α; Liu et al., "
                "2017, not in the paper). Where it "
                "looks was taught with the world's masks, not learnt from the captions alone.")
    st.markdown("Every region's annotation vector a_i is scored against the previous hidden state; "
                "a softmax over the L regions gives the weights α_t.")
    st.latex(r"e_{ti} = f_{\mathrm{att}}(a_i, h_{t-1}), \qquad \alpha_{ti} = \frac{\exp(e_{ti})}{\sum_{k=1}^{L} \exp(e_{tk})}")
    st.latex(rf"t = {t}:\quad \max_i \alpha_{{ti}} = {s.max:.3f} \text{{ at row {s.argmax[0]}, col {s.argmax[1]}}}")
    st.latex(rf"L = {gh} \times {gw} = {gh * gw}, \quad \text{{uniform}}\ \alpha_{{ti}} = 1/L = {1 / (gh * gw):.4f}")
    st.latex(rf"H(\alpha_t) = {s.entropy:.2f}\ \text{{nats}} \;\Rightarrow\; e^{{H}} = {s.effective_regions:.1f}"
             r"\ \text{regions effectively attended}")


def draw_context(view: StepView, t: int, hard: bool, sampled: bool = False) -> None:
    st.subheader("2 · Context: what is seen")
    if hard:
        st.markdown("Hard attention picks **one** region: the location s_t is sampled with probabilities α_t. "
                    "At test time the paper uses the expectation (the soft blend) unless sampling is on in the "
                    "sidebar. There is no gate β: the context is the chosen region's vector itself.")
        st.latex(r"p(s_{t,i} = 1 \mid s_{<t}, a) = \alpha_{t,i}, \qquad \hat z_t = \sum_i s_{t,i}\, a_i")
        r, c = divmod(view.location, view.alpha.shape[1]) if view.location >= 0 else (-1, -1)
        where = "s_t" if sampled else r"\arg\max_i \alpha_{ti}"
        st.latex(rf"t = {t}:\quad {where} = \text{{row {r}, col {c}}},\quad \alpha = "
                 rf"{float(view.alpha.reshape(-1)[view.location]) if view.location >= 0 else 0.0:.3f}")
        if not sampled:
            st.caption("Nothing is sampled in expectation mode: the cell shown is the argmax of α_t.")
        return
    st.markdown("Soft attention blends all regions by α_t, scaled by the gate β_t, which lets the decoder "
                "lean on its language model instead of the image.")
    st.latex(r"\hat z_t = \beta_t \sum_{i=1}^{L} \alpha_{ti}\, a_i, \qquad \beta_t = \sigma\!\left(f_\beta(h_{t-1})\right)")
    st.latex(rf"t = {t}:\quad \beta_t = {view.beta:.3f}")


def draw_output(view: StepView, t: int) -> None:
    st.subheader("3 · Output: which word")
    st.markdown("The LSTM reads the previous word, its state and the context; the deep output layer turns "
                "its new state into a distribution over the vocabulary.")
    st.latex(r"i_t, f_t, o_t = \sigma(\cdot),\quad g_t = \tanh(\cdot)")
    st.latex(r"c_t = f_t \odot c_{t-1} + i_t \odot g_t,\quad h_t = o_t \odot \tanh(c_t)")
    st.latex(r"p(y_t \mid a, y_{<t}) \propto \exp\!\big(L_o(E y_{t-1} + L_h h_t + L_z \hat z_t)\big)")
    terms = [rf"p({_tex_word(w)}) = {p:.3f}" for w, p in zip(view.top_words[:4], view.top_probs[:4])]
    st.latex(rf"t = {t}:\quad " + r",\quad ".join(terms[:2]))
    if terms[2:]:
        st.latex(r",\quad ".join(terms[2:]))
    st.latex(rf"\text{{chosen}}: {_tex_word(view.word)},\quad \log p = {view.logprob:.3f}"
             + (r"\ \text{(forced)}" if view.forced else r"\ \text{(by beam search)}" if view.beam_chose else ""))
    if view.beam_chose:
        st.caption(f"Not the most probable word of this step: the caption followed is the beam's best (Step "
                   f"through's *Follow*), which goes on with “{view.word}”; greedy decoding would take "
                   f"“{view.top_words[0]}”.")


def penalty_scale(alphas, n_regions: int) -> tuple[float, float, float]:
    """(Σ_i (1 − Σ_t α_ti)², its mean per region, its value under uniform attention for as many steps)."""
    value = float(doubly_stochastic(alphas))
    uniform = n_regions * (1.0 - len(alphas) / n_regions) ** 2  # every region gets T/L
    return value, value / n_regions, uniform


def draw_penalty(session: DecodeSession, lam: float | None, hard: bool) -> None:
    alphas = session.alphas  # (T, L)
    T, L = alphas.shape
    value, per_region, uniform = penalty_scale(alphas, L)
    if hard:
        st.markdown("**The doubly stochastic penalty**, for comparison: it is part of soft attention's loss; "
                    "hard attention is trained without it (λ = 0, `sat_core.train`).")
    else:
        st.markdown("Soft attention is trained with the doubly stochastic penalty, which pushes every region to "
                    "receive about one unit of attention over the whole caption"
                    + (f" (this checkpoint: λ = {lam:g})." if lam is not None else "."))
        st.latex(r"L_d = -\log p(y \mid a) + \lambda \sum_{i=1}^{L} \Big(1 - \sum_t \alpha_{ti}\Big)^2")
    st.markdown(f"Over the {plural(T, 'step')} so far:")
    st.latex(rf"\sum_i \Big(1 - \sum_t \alpha_{{ti}}\Big)^2 = {value:.2f} \;=\; {per_region:.3f}\ \text{{per region}}")
    st.markdown(f"Under uniform attention for {plural(T, 'step')} (α_ti = 1/{L}, every region gets {T}/{L}):")
    st.latex(rf"{L} \Big(1 - \tfrac{{{T}}}{{{L}}}\Big)^2 = {uniform:.2f} \;=\; {uniform / L:.3f}\ \text{{per region}}")
    st.caption(f"0 would mean every region received exactly one unit of attention; with {plural(T, 'step')} and "
               f"{L} regions even uniform attention gives {uniform:.2f}, so compare the two numbers, not either with 0.")


def draw_hard_objective(hard: HardAttentionConfig, view: StepView) -> None:
    st.markdown("Hard attention maximises a lower bound on log p(y | a), averaged over sampled locations "
                "s̃ ~ Multinoulli(α); its gradient is estimated with REINFORCE:")
    st.latex(r"L_s = \sum_s p(s \mid a) \log p(y \mid s, a) \;\le\; \log p(y \mid a)")
    # one term a line: the page's right-hand column is narrow, and a cut equation teaches nothing
    st.latex(r"\begin{aligned}\frac{\partial L_s}{\partial W} \approx \frac{1}{N} \sum_{n=1}^{N} \Big[&"
             r"\frac{\partial \log p(y \mid \tilde s^n, a)}{\partial W} \\ &+ \lambda_r \big(\log p(y \mid \tilde s^n, a) - b\big)"
             r"\frac{\partial \log p(\tilde s^n \mid a)}{\partial W} \\ &+ \lambda_e \frac{\partial H[\tilde s^n]}{\partial W}\Big]"
             r"\end{aligned}")
    decay = hard.baseline_decay
    st.latex(rf"b_k = {decay:g}\, b_{{k-1}} + {1 - decay:g} \log p(y \mid \tilde s_k, a)")
    off = "" if hard.reinforce else r"\ (\text{off})"
    st.markdown("This checkpoint was trained with:")
    st.latex(rf"\lambda_r = {hard.reinforce_weight:g}{off},\quad \lambda_e = {hard.entropy_weight:g},"
             rf"\quad \text{{baseline {'on' if hard.baseline else 'off'}}}")
    st.caption(f"With probability {hard.mix_soft_prob:g} an example is trained with the expectation α instead of a "
               "sample (the paper's stabiliser).")
    st.markdown("The entropy the bonus rewards, at this step:")
    st.latex(rf"t = {view.index + 1}:\quad H[\alpha_t] = {alpha_summary(view.alpha).entropy:.2f}\ \text{{nats}}")


def main() -> None:
    st.title("How it works")
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    hard = bool(loaded.model.hard)
    stepping.apply_presses(stepper.pressed("teach_keys", "teach_next", "teach_back"))  # queued ← → and clicks
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
    st.caption(f"The numbers below are those of the current step of *Step through* (same image, same model: "
               f"{'hard' if hard else 'soft'} attention).")
    picture, equations = st.columns([2, 3])
    with picture:
        draw_picture(ctx, image, session, view, hard)
    with equations:
        draw_attention(view, t, loaded.optim)
        draw_context(view, t, hard, ctx.decode.hard_mode == "sample")
        draw_output(view, t)
        st.subheader("4 · Training signal: " + ("REINFORCE over sampled locations" if hard else "look everywhere once"))
        if hard:
            draw_hard_objective(loaded.model_config.hard, view)
        draw_penalty(session, None if hard else dsa_lambda(loaded), hard)


main()
